#include "core/pending_frees.h"

namespace torch_uvm {

PendingFrees::~PendingFrees() {
  for (auto& [device, events] : spare_events_) {
    for (EventHandle e : events) runtime_.destroy_event(e);
  }
  for (const PendingEvent& p : events_) runtime_.destroy_event(p.event);
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

void PendingFrees::defer(Block* block) {
  block->state = BlockState::kPendingFree;
  block->pending_events = 0;
  for (const StreamRef& stream : block->stream_uses) {
    EventHandle e = acquire_event(stream.device);
    try {
      runtime_.record_event(e, stream);
    } catch (...) {
      release_event(stream.device, e);
      throw;
    }
    events_.push_back({e, stream.device, block});
    ++block->pending_events;
  }
}

std::vector<Block*> PendingFrees::take_completed() {
  std::vector<Block*> ready;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < events_.size(); ++i) {
    PendingEvent p = events_[i];
    if (runtime_.query_event(p.event)) {
      release_event(p.device, p.event);
      if (--p.block->pending_events == 0) ready.push_back(p.block);
    } else {
      events_[kept++] = p;
    }
  }
  events_.resize(kept);
  return ready;
}

std::vector<Block*> PendingFrees::take_all_synchronized() {
  std::vector<Block*> ready;
  for (const PendingEvent& p : events_) {
    runtime_.synchronize_event(p.event);
    release_event(p.device, p.event);
    if (--p.block->pending_events == 0) ready.push_back(p.block);
  }
  events_.clear();
  return ready;
}

}  // namespace torch_uvm
