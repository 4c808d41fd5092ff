#include "core/pending_frees.h"

#include <exception>
#include <string>

namespace torch_uvm {

PendingFrees::~PendingFrees() {
  try {
    for (auto& [device, events] : spare_events_) {
      for (EventHandle e : events) runtime_.destroy_event(e);
    }
    for (const PendingEvent& p : events_) runtime_.destroy_event(p.event);
  } catch (...) {
    // The runtime may be shutting down with the process.
  }
}

EventHandle PendingFrees::acquire_event(DeviceIndex device) {
  auto& spare = spare_events_[device];
  if (spare.empty()) return runtime_.create_event(device);
  EventHandle e = spare.back();
  spare.pop_back();
  return e;
}

void PendingFrees::release_event(DeviceIndex device, EventHandle event) {
  spare_events_[device].push_back(event);
}

bool PendingFrees::fence(Block* block, StreamRef stream) {
  EventHandle e = nullptr;
  try {
    e = acquire_event(stream.device);
    runtime_.record_event(e, stream);
    events_.push_back({e, stream.device, block});
    ++block->pending_events;
    return true;
  } catch (const std::exception&) {
    if (e != nullptr) release_event(stream.device, e);
  }
  try {
    runtime_.synchronize_stream(stream);  // slower, as safe
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool PendingFrees::defer(Block* block) {
  block->state = BlockState::kPendingFree;
  block->pending_events = 0;
  // stream_uses keeps only the streams still to fence.
  std::vector<StreamRef> unfenced;
  for (const StreamRef& stream : block->stream_uses) {
    if (!fence(block, stream)) unfenced.push_back(stream);
  }
  block->stream_uses = std::move(unfenced);
  if (!block->stream_uses.empty()) retry_.push_back(block);
  return block->stream_uses.empty() && block->pending_events == 0;
}

std::vector<Block*> PendingFrees::retry_unfenced() {
  std::vector<Block*> ready;
  std::vector<Block*> blocks;
  blocks.swap(retry_);
  for (Block* b : blocks) {
    std::vector<StreamRef> still;
    for (const StreamRef& s : b->stream_uses) {
      if (!fence(b, s)) still.push_back(s);
    }
    b->stream_uses = std::move(still);
    if (!b->stream_uses.empty()) {
      retry_.push_back(b);
    } else if (b->pending_events == 0) {
      ready.push_back(b);
    }
  }
  return ready;
}

void PendingFrees::count_down(const PendingEvent& p, std::vector<Block*>& ready) {
  release_event(p.device, p.event);
  // A block still in retry_ leaves through retry_unfenced.
  if (--p.block->pending_events == 0 && p.block->stream_uses.empty()) ready.push_back(p.block);
}

std::vector<Block*> PendingFrees::take_completed() {
  std::vector<Block*> ready = retry_.empty() ? std::vector<Block*>{} : retry_unfenced();
  std::vector<PendingEvent> kept;
  kept.reserve(events_.size());
  for (const PendingEvent& p : events_) {
    bool complete = false;
    try {
      complete = runtime_.query_event(p.event);
    } catch (const std::exception&) {
      complete = false;  // asked again next time
    }
    if (complete) {
      count_down(p, ready);
    } else {
      kept.push_back(p);
    }
  }
  events_.swap(kept);
  return ready;
}

std::vector<PendingFrees::PendingEvent> PendingFrees::detach() {
  std::vector<PendingEvent> out;
  out.swap(events_);
  return out;
}

std::string PendingFrees::wait(std::vector<PendingEvent>& events, std::vector<bool>& done) {
  std::string error;
  done.assign(events.size(), false);
  for (std::size_t i = 0; i < events.size(); ++i) {
    try {
      runtime_.synchronize_event(events[i].event);
      done[i] = true;
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
  }
  return error;
}

std::vector<Block*> PendingFrees::settle(const std::vector<PendingEvent>& events,
                                         const std::vector<bool>& done) {
  std::vector<Block*> ready;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (done[i]) {
      count_down(events[i], ready);
    } else {
      events_.push_back(events[i]);  // waited on again later
    }
  }
  return ready;
}

}  // namespace torch_uvm
