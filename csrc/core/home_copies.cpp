// HomeCopies (home_copies.h): copies home under way, and the waits for them.
#include "core/home_copies.h"

#include <utility>

namespace torch_uvm {

HomeCopies::HomeCopies(Runtime& runtime, ResidencyBudget& budget, ShareId share,
                       OnWait on_wait)
    : runtime_(runtime),
      budget_(budget),
      device_(budget.device_of(share)),
      share_(share),
      on_wait_(std::move(on_wait)),
      last_(runtime) {}

void HomeCopies::queued(std::size_t bytes, std::size_t beside, StreamRef stream) {
  if (bytes == 0) return;
  last_.record(stream);
  auto done = std::make_unique<RuntimeEvent>(runtime_);
  done->record(stream);
  budget_.leaving(device_, share_, bytes);
  pending_.push_back({std::move(done), bytes, beside});
  under_way_ += bytes;
  beside_ += beside;
}

void HomeCopies::pass_oldest() {
  budget_.left(device_, share_, pending_.front().bytes);
  under_way_ -= pending_.front().bytes;
  beside_ -= pending_.front().beside;
  pending_.pop_front();
}

void HomeCopies::reap() {
  while (!pending_.empty() && pending_.front().done->done()) pass_oldest();
}

// Only the copy waited for leaves the books: those after it are found passed
// at the next reap.
void HomeCopies::wait_oldest() {
  {
    const std::shared_ptr<void> scope = on_wait_ ? on_wait_(pending_.front().bytes) : nullptr;
    pending_.front().done->wait();  // (raised, it stays counted and under way)
  }
  pass_oldest();
}

void HomeCopies::make_room(std::size_t extra) {
  reap();
  while (!pending_.empty() && budget_.excess(device_, share_, extra) > 0) wait_oldest();
}

void HomeCopies::at_most(std::size_t limit) {
  reap();
  while (beside_ > limit && pending_.size() > 1) wait_oldest();
}

}  // namespace torch_uvm
