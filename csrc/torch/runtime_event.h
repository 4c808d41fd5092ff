// An event of the runtime's (runtime.h), owned: created on first record,
// destroyed with its owner (a pending event is released by the driver once
// it completes).
#pragma once

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

}  // namespace torch_uvm
