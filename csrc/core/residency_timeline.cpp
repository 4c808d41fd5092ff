#include "core/residency_timeline.h"

#include <utility>

namespace torch_uvm {

const char* kind_name(ResidencyEvent::Kind kind) {
  switch (kind) {
    case ResidencyEvent::kArrive: return "arrive";
    case ResidencyEvent::kAdopt: return "adopt";
    case ResidencyEvent::kDrop: return "drop";
    case ResidencyEvent::kWriteHome: return "write_home";
    case ResidencyEvent::kDiscard: return "discard";
    case ResidencyEvent::kForget: return "forget";
  }
  return "?";
}

void ResidencyTimeline::record(ResidencyEvent e) {
  if (capacity_ == 0) {
    ++dropped_;
    return;
  }
  if (events_.size() == capacity_) {
    events_.pop_front();
    ++dropped_;
  }
  events_.push_back(std::move(e));
}

}  // namespace torch_uvm
