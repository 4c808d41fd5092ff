// An event of the runtime's (runtime.h), owned: created on first record,
// destroyed with its owner (a pending event is released by the driver once
// it completes).
#pragma once

#include <memory>
#include <vector>

#include "core/runtime.h"

namespace torch_uvm {

class RuntimeEvent {
 public:
  explicit RuntimeEvent(Runtime& rt) : rt_(&rt) {}
  RuntimeEvent(const RuntimeEvent&) = delete;
  RuntimeEvent& operator=(const RuntimeEvent&) = delete;
  ~RuntimeEvent() {
    if (event_ == nullptr) return;
    try {
      rt_->destroy_event(event_);
    } catch (...) {
    }
  }

  // The work queued on `stream` so far.
  void record(StreamRef stream) {
    if (event_ == nullptr) event_ = rt_->create_event(stream.device);
    rt_->record_event(event_, stream);
    recorded_ = true;
    blocked_.clear();
  }
  // `stream`'s later work waits for it (nothing if never recorded, nor if
  // `stream` waits for this record already: a slot's bring and each tensor
  // of a unit wait on one event).
  void block(StreamRef stream) const {
    if (!recorded_) return;
    for (const StreamRef& s : blocked_) {
      if (s == stream) return;
    }
    rt_->stream_wait_event(stream, event_);
    blocked_.push_back(stream);
  }
  // Whether the work it marks is done (never recorded: done).
  bool done() const { return !recorded_ || rt_->query_event(event_); }
  // The host waits for that work.
  void wait() const {
    if (recorded_) rt_->synchronize_event(event_);
  }

 private:
  Runtime* rt_;
  EventHandle event_ = nullptr;
  bool recorded_ = false;
  mutable std::vector<StreamRef> blocked_;  // since the last record
};

// The work queued so far on several streams (every compute stream a slot may
// have been used on: a step can run on a stream of its own), one event each.
class StreamsPassed {
 public:
  explicit StreamsPassed(Runtime& rt) : rt_(&rt) {}

  void record(const std::vector<StreamRef>& streams) {
    while (events_.size() < streams.size()) events_.push_back(std::make_unique<RuntimeEvent>(*rt_));
    for (std::size_t k = 0; k < streams.size(); ++k) events_[k]->record(streams[k]);
    recorded_ = streams.size();
  }
  // `stream`'s later work waits for all of it.
  void block(StreamRef stream) const {
    for (std::size_t k = 0; k < recorded_; ++k) events_[k]->block(stream);
  }

 private:
  Runtime* rt_;
  std::vector<std::unique_ptr<RuntimeEvent>> events_;
  std::size_t recorded_ = 0;
};

}  // namespace torch_uvm
