// StepsBehind (steps_behind.h): steps in backward under way, and the wait for them.
#include "core/steps_behind.h"

#include <algorithm>

namespace torch_uvm {

void StepsBehind::queued(StreamRef stream) {
  auto done = std::make_unique<RuntimeEvent>(runtime_);
  done->record(stream);
  pending_.push_back(std::move(done));
}

void StepsBehind::reap() {
  while (!pending_.empty() && pending_.front()->done()) pending_.pop_front();
}

std::size_t StepsBehind::under_way() {
  reap();
  return pending_.size();
}

void StepsBehind::at_most(std::size_t limit) {
  limit = std::max<std::size_t>(limit, 1);
  reap();
  while (pending_.size() > limit) {
    {
      const std::shared_ptr<void> scope = on_wait_ ? on_wait_() : nullptr;
      pending_.front()->wait();  // (raised, it stays under way)
    }
    ++waits_;
    pending_.pop_front();
  }
}

}  // namespace torch_uvm
