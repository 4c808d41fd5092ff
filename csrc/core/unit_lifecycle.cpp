#include "core/unit_lifecycle.h"

#include <stdexcept>

#include "core/errors.h"

namespace torch_uvm {
namespace {

template <typename... Args>
void check_order(bool ok, const Args&... what) {
  if (!ok) throw OrderError(detail::concat(what...));
}

}  // namespace

const char* to_string(UnitState state) {
  switch (state) {
    case UnitState::kIdle: return "idle";
    case UnitState::kBackward: return "backward";
    case UnitState::kGradients: return "gradients";
    case UnitState::kGradientsDone: return "gradients done";
    case UnitState::kStepped: return "stepped";
  }
  return "?";
}

UnitLifecycle::UnitLifecycle(std::vector<std::string> names) {
  units_.resize(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) units_[i].name = std::move(names[i]);
}

UnitLifecycle::Unit& UnitLifecycle::at(int unit) {
  TORCH_UVM_CHECK_ARG(unit >= 0 && unit < static_cast<int>(units_.size()), "torch_uvm: unit ",
                      unit, " does not exist (an offload has ", units_.size(), ")");
  return units_[unit];
}

const UnitLifecycle::Unit& UnitLifecycle::at(int unit) const {
  return const_cast<UnitLifecycle*>(this)->at(unit);
}

void UnitLifecycle::set_expected(int unit, int gradients) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(gradients >= 0, "torch_uvm: a unit expects no fewer than 0 gradients");
  Unit& u = at(unit);
  u.expected = gradients;
  if (u.seen >= gradients) {  // (fewer trainable now: what it counted no longer completes)
    u.seen = 0;
    if (u.state == UnitState::kGradients) u.state = UnitState::kBackward;
  }
}

int UnitLifecycle::expected(int unit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return at(unit).expected;
}

UnitLifecycle::BackwardBegin UnitLifecycle::backward_begins(int unit, bool step_in_backward) {
  std::lock_guard<std::mutex> lock(mutex_);
  Unit& u = at(unit);
  BackwardBegin begin;
  if (!active_) {
    check_order(
        !(step_in_backward && stepped_in_backward_),
        "torch_uvm: a second backward before optimizer.step(): with step_in_backward, each "
        "submodule already stepped during the last backward. Call optimizer.step() after every "
        "backward; to accumulate gradients over several, use stream_optimizer(optimizer, "
        "step_in_backward=False)");
    active_ = true;
    begin.opened = true;
  }
  begin.released.swap(frozen_running_);
  if (u.expected == 0) frozen_running_.push_back(unit);
  if (u.state == UnitState::kIdle || u.state == UnitState::kGradientsDone) {
    u.state = UnitState::kBackward;
  }
  return begin;
}

bool UnitLifecycle::gradient(int unit, std::int64_t task) {
  std::lock_guard<std::mutex> lock(mutex_);
  Unit& u = at(unit);
  if (u.task != task) {
    u.task = task;
    u.seen = 0;
  }
  ++u.seen;
  const bool complete = u.seen == u.expected;
  if (u.state != UnitState::kStepped) {
    u.state = complete ? UnitState::kGradientsDone : UnitState::kGradients;
  }
  if (complete) u.seen = 0;  // (a reentrant part's gradients count anew)
  return complete;
}

bool UnitLifecycle::steps_in_backward(int unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Unit& u = at(unit);
  check_order(
      u.state != UnitState::kStepped, "torch_uvm: the gradients of submodule '", u.name,
      "' came twice in one backward (reentrant activation checkpointing runs each segment's "
      "backward on its own, and this submodule is in two): with step_in_backward it would step "
      "on each part alone. Use checkpoint(..., use_reentrant=False), or "
      "stream_optimizer(optimizer) without step_in_backward");
  return u.on_host;
}

void UnitLifecycle::stepped(int unit, bool in_backward) {
  std::lock_guard<std::mutex> lock(mutex_);
  at(unit).state = UnitState::kStepped;
  if (in_backward) stepped_in_backward_ = true;
}

bool UnitLifecycle::has_stepped(int unit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return at(unit).state == UnitState::kStepped;
}

std::vector<int> UnitLifecycle::stepped_locked() const {
  std::vector<int> out;
  for (int i = 0; i < units(); ++i) {
    if (units_[i].state == UnitState::kStepped) out.push_back(i);
  }
  return out;
}

std::vector<int> UnitLifecycle::stepped_units() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stepped_locked();
}

std::vector<int> UnitLifecycle::stepped_in_backward() const {
  std::lock_guard<std::mutex> lock(mutex_);   // (one lock: the flag and the units agree)
  return stepped_in_backward_ ? stepped_locked() : std::vector<int>{};
}

void UnitLifecycle::set_host_units(const std::vector<int>& units) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Unit& u : units_) u.on_host = false;
  for (int i : units) at(i).on_host = true;
}

bool UnitLifecycle::on_host(int unit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return at(unit).on_host;
}

bool UnitLifecycle::backward_active() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_;
}

std::vector<int> UnitLifecycle::end_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = false;
  frozen_running_.clear();
  std::vector<int> partial;
  for (int i = 0; i < units(); ++i) {
    Unit& u = units_[i];
    if (u.seen > 0 && u.seen < u.expected) partial.push_back(i);
    u.seen = 0;
    u.task = -1;
    if (u.state == UnitState::kBackward) u.state = UnitState::kIdle;
    if (u.state == UnitState::kGradients) u.state = UnitState::kGradientsDone;
  }
  return partial;
}

std::vector<int> UnitLifecycle::step_ends() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> stepped = stepped_locked();
  for (Unit& u : units_) {
    if (u.state == UnitState::kStepped || u.state == UnitState::kGradientsDone) {
      u.state = UnitState::kIdle;
    }
  }
  stepped_in_backward_ = false;
  return stepped;
}

UnitState UnitLifecycle::state(int unit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return at(unit).state;
}

void UnitLifecycle::check() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto broken = [](const std::string& what) { throw std::logic_error("UnitLifecycle: " + what); };
  bool any_stepped = false;
  for (const Unit& u : units_) {
    if (u.seen < 0 || (u.seen >= u.expected && u.seen > 0)) {
      broken("unit '" + u.name + "' counts " + std::to_string(u.seen) + " of " +
             std::to_string(u.expected) + " gradients");
    }
    if (u.state == UnitState::kGradients && u.seen == 0) {
      broken("unit '" + u.name + "' is in its gradients with none counted");
    }
    if (!active_ && (u.state == UnitState::kBackward || u.state == UnitState::kGradients)) {
      broken("unit '" + u.name + "' is " + to_string(u.state) + " with no backward under way");
    }
    if (!active_ && u.seen != 0) broken("unit '" + u.name + "' counts gradients between backwards");
    any_stepped = any_stepped || u.state == UnitState::kStepped;
  }
  if (stepped_in_backward_ && !any_stepped) broken("a step in backward with no unit stepped");
  if (!active_ && !frozen_running_.empty()) broken("frozen units held with no backward under way");
  for (int i : frozen_running_) {
    if (units_[i].expected != 0) broken("unit '" + units_[i].name + "' held as frozen but trains");
  }
}

}  // namespace torch_uvm
