// The optimizer steps a backward queued on a stream of their own (a step in
// backward, on the GPU), and the one throttle on them. Each step lets go of
// its unit's gradients, but their memory is reused only once the step ran:
// the host queues the backward far ahead of the GPU, so while the steps lag
// (a step waits for its states' copy to the GPU; the backward's own work on
// a unit may take far less), PyTorch's allocator holds the gradients of
// every step not yet run, and reserves more the further the host runs. The
// host waits for the oldest step while more than a given number are under
// way: the gradients alive are then those of that many units beside the
// one being made (what the estimate counts as gradients in flight).
// Policy over the runtime's events (core/runtime.h): tested on HostRuntime.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>

#include "core/runtime.h"
#include "core/runtime_event.h"

namespace torch_uvm {

class StepsBehind {
 public:
  // Called before the host waits for a step; what it returns lives until
  // the wait ends (a trace's range).
  using OnWait = std::function<std::shared_ptr<void>()>;

  explicit StepsBehind(Runtime& runtime, OnWait on_wait = nullptr)
      : runtime_(runtime), on_wait_(std::move(on_wait)) {}

  // A step was queued on `stream`, up to now.
  void queued(StreamRef stream);
  // Waits, oldest first, while more than `limit` steps are under way (at
  // least the newest stays under way: `limit` 0 counts as 1).
  void at_most(std::size_t limit);
  // The steps under way (those found run leave first).
  std::size_t under_way();
  // How many times the host waited (tests, stats).
  std::size_t waits() const { return waits_; }

 private:
  void reap();

  Runtime& runtime_;
  OnWait on_wait_;
  std::deque<std::unique_ptr<RuntimeEvent>> pending_;  // oldest first
  std::size_t waits_ = 0;
};

}  // namespace torch_uvm
