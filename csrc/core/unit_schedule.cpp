// UnitSchedule (unit_schedule.h): the route, the units brought ahead, and
// what a pass lets go.
#include "core/unit_schedule.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

#include "core/errors.h"

namespace torch_uvm {

UnitSchedule::UnitSchedule(const ResidencyBudget& budget, ShareId share, int ahead,
                           bool in_place, bool training)
    : budget_(budget), share_(share), ahead_(ahead), in_place_(in_place), training_(training) {
  TORCH_UVM_CHECK_ARG(ahead >= 1, "torch_uvm: ahead must be at least 1 (got ", ahead, ")");
}

UnitSchedule::Unit& UnitSchedule::at(int unit) {
  TORCH_UVM_CHECK_ARG(unit >= 0 && unit < static_cast<int>(units_.size()), "torch_uvm: unit ",
                      unit, " does not exist (an offload has ", units_.size(), ")");
  return units_[unit];
}

const UnitSchedule::Unit& UnitSchedule::at(int unit) const {
  return const_cast<UnitSchedule*>(this)->at(unit);
}

int UnitSchedule::add_unit(std::size_t trainable_bytes) {
  Unit u;
  u.trainable_bytes = trainable_bytes;
  units_.push_back(u);
  seq_pos_.push_back(-1);
  return static_cast<int>(units_.size()) - 1;
}

void UnitSchedule::set_trainable_bytes(int unit, std::size_t bytes) {
  at(unit).trainable_bytes = bytes;
}

std::size_t UnitSchedule::largest_trainable() const {
  std::size_t largest = 0;
  for (const Unit& u : units_) largest = std::max(largest, u.trainable_bytes);
  return largest;
}

void UnitSchedule::set_in_place(bool in_place) {
  TORCH_UVM_CHECK_ARG(!planned_, "torch_uvm: how an offload streams is chosen before its plan");
  in_place_ = in_place;
}

void UnitSchedule::set_training(bool training) {
  TORCH_UVM_CHECK_ARG(!planned_, "torch_uvm: whether an offload trains is set before its plan");
  training_ = training;
}

std::vector<int> UnitSchedule::pass_order() const {
  std::vector<int> order;
  std::unordered_set<int> taken;
  for (int u : seen_) {
    if (taken.insert(u).second) order.push_back(u);
  }
  for (int u = 0; u < units(); ++u) {
    if (taken.insert(u).second) order.push_back(u);  // never ran: last
  }
  return order;
}

void UnitSchedule::plan(const std::vector<int>& order, const std::vector<bool>& resident,
                        const std::vector<std::size_t>& stream_bytes,
                        std::size_t largest_streamed, std::size_t step_units) {
  TORCH_UVM_CHECK_ARG(order.size() == units_.size() && resident.size() == order.size() &&
                          stream_bytes.size() == order.size(),
                      "torch_uvm: a plan names every unit once (", units_.size(), " units, ",
                      order.size(), " in the order)");
  order_ = order;
  position_.assign(units_.size(), -1);
  for (std::size_t i = 0; i < order_.size(); ++i) {
    Unit& u = at(order_[i]);
    TORCH_UVM_CHECK_ARG(position_[order_[i]] < 0, "torch_uvm: a plan names unit ", order_[i],
                        " twice");
    position_[order_[i]] = static_cast<int>(i);
    u.resident = resident[i];
    u.stream_bytes = stream_bytes[i];
  }
  window_bytes_ = static_cast<std::size_t>(ahead_ + 1) * largest_streamed;
  step_units_ = step_units;
  planned_ = true;
}

UnitSchedule::Begin UnitSchedule::begins(int unit, bool backward, bool grad_enabled) {
  Unit& u = at(unit);
  Begin b;
  // (refused before anything changes: nothing held is left behind, no route recorded)
  TORCH_UVM_CHECK_ARG(u.running || !u.home_busy || u.staged || (in_place_ && !u.resident),
                      "torch_uvm: internal error: unit ", unit,
                      " was brought while a host step writes its homes; please report it");
  if (!planned_) seen_.push_back(unit);
  if (!backward && training_ && !in_backward_ && grad_enabled) {
    seq_pos_[unit] = static_cast<int>(forward_seq_.size());  // its backward's route
    forward_seq_.push_back(unit);
  }
  in_backward_ = in_backward_ || backward;
  if (u.running) {  // run again before its end (a module called twice)
    b.arrival = Arrival::kAgain;
    return b;
  }
  u.running = true;
  u.running_backward = backward;
  if (planned_) let_go_of_passed(unit, backward, b.let_go);
  if (in_place_ && !u.resident) {
    b.arrival = Arrival::kInPlace;
  } else if (u.staged) {
    u.staged = false;  // its holds pass to this run
    staged_.erase(std::find(staged_.begin(), staged_.end(), unit));
    u.held = true;
    b.arrival = Arrival::kStaged;
  } else {
    b.arrival = Arrival::kOnDemand;
  }
  return b;
}

void UnitSchedule::held(int unit) { at(unit).held = true; }

bool UnitSchedule::ends(int unit) {
  Unit& u = at(unit);
  u.running = false;
  const bool was = u.held;
  u.held = false;
  return was;
}

// A backward retraces the forward that built its graph: the units that
// ran in it, in reverse (a routed expert, a branch taken), not the order of
// the plan, which only the first forward gave.
bool UnitSchedule::on_route(bool backward) const { return backward && !forward_seq_.empty(); }

const std::vector<int>& UnitSchedule::route(bool backward) const {
  return on_route(backward) ? forward_seq_ : order_;
}

int UnitSchedule::place(int unit, bool backward) const {
  return on_route(backward) ? seq_pos_[unit] : position_[unit];
}

int UnitSchedule::distance(int from, int to, bool backward) const {
  const int n = static_cast<int>(order_.size());
  const int d = backward ? from - to : to - from;
  return !backward && !training_ ? (d % n + n) % n : d;  // inference's forwards wrap round
}

void UnitSchedule::let_go_of_passed(int unit, bool backward, std::vector<int>& out) {
  const int here = place(unit, backward);
  if (here < 0) return;
  for (std::size_t k = 0; k < staged_.size();) {
    const int s = staged_[k];
    const Unit& v = units_[s];
    const int from = v.staged_from, there = place(s, backward);
    if (s != unit && v.staged_backward == backward &&
        (there < 0 || distance(from, here, backward) > distance(from, there, backward))) {
      unstage(s);  // (removes it from staged_)
      out.push_back(s);
    } else {
      ++k;
    }
  }
}

void UnitSchedule::unstage(int unit) {
  units_[unit].staged = false;
  staged_.erase(std::find(staged_.begin(), staged_.end(), unit));
}

void UnitSchedule::bring_ahead(int unit, bool backward,
                               const std::function<bool(int, bool)>& bring) {
  // (a forward recomputed inside a backward, activation checkpointing, runs
  // units the backward already passed: nothing to bring ahead of it)
  if (!planned_ || in_place_ || (!backward && in_backward_)) return;
  const std::vector<int>& r = route(backward);
  const int here = place(unit, backward);
  if (r.empty() || here < 0) return;
  const int n = static_cast<int>(r.size());
  const bool wrap = !backward && !training_;
  // The window holds the running unit and what is brought ahead: `ahead`
  // units' worth of bytes beside a streamed one, the whole window beside a
  // resident one (a pass's resident end brings the next pass's first
  // units meanwhile). Counted in bytes, small units (a norm's weight) do
  // not stop the link ahead of a large one. Training, beyond the window, the
  // next units come while the budget has room that nothing holds (the room a
  // training step makes for its gradients and states is empty in a
  // forward; a backward keeps what its steps still need): the link keeps
  // busy while the GPU computes on units it already holds (a resident
  // start; a backward's first units, left from its forward). Nothing
  // leaves for them. (3B Llama under 8 GiB, H200, 2026-11-27: the link
  // idle 58 ms of a 187 ms forward, and 94 ms at its backward's start.)
  const Unit& running = units_[unit];
  const std::size_t own = running.resident ? 0 : running.stream_bytes;
  const std::size_t cap = window_bytes_ > own ? window_bytes_ - own : 0;
  std::size_t ahead = 0;
  for (int k = 1; k < n; ++k) {
    int j = here + (backward ? -k : k);
    if (wrap) j = (j % n + n) % n;
    if (j < 0 || j >= n) break;
    const int next = r[j];
    Unit& v = units_[next];
    if (v.resident || v.stream_bytes == 0 || place(next, backward) != j) {
      continue;  // nothing to bring, or it runs again later on the route
    }
    const bool beyond = ahead > 0 && ahead + v.stream_bytes > cap;
    if (beyond && !room_beyond_window(v.stream_bytes, here, backward)) break;
    ahead += v.stream_bytes;
    if (v.staged || v.running) continue;
    // a host step writes its homes: it comes on demand once that is done
    // (and what follows it is brought ahead from there)
    if (v.home_busy) break;
    if (!bring(next, beyond)) break;  // (it comes on demand)
    v.staged = true;
    v.staged_backward = backward;
    v.staged_from = here;
    staged_.push_back(next);
  }
}

bool UnitSchedule::room_beyond_window(std::size_t bytes, int at, bool backward) const {
  // (inference: its plan leaves no room beside the resident units and the window)
  if (!training_) return false;
  const ResidencyStats s = budget_.share_stats(share_);
  const std::size_t keep = backward ? step_room(at) : 0;
  return s.limit > 0 && s.resident_bytes + s.leaving_bytes + bytes + keep <= s.limit;
}

std::size_t UnitSchedule::step_room(int at) const {
  const std::vector<int>& r = route(true);
  std::size_t largest = 0;
  for (int k = std::min(at, static_cast<int>(r.size()) - 1); k >= 0; --k) {
    largest = std::max(largest, units_[r[k]].trainable_bytes);
  }
  return step_units_ * largest;
}

std::vector<int> UnitSchedule::end_pass() {
  // a backward's end closes the route it retraced; forwards whose backward
  // never came (graphs built and dropped) do not pile up
  if (in_backward_ || forward_seq_.size() > 4 * units_.size()) {
    for (int u : forward_seq_) seq_pos_[u] = -1;
    forward_seq_.clear();
    in_backward_ = false;
  }
  std::vector<int> release;
  for (int i = 0; i < units(); ++i) {
    Unit& u = units_[i];
    if (u.running && ends(i)) release.push_back(i);
    // inference's forwards wrap round: what the last brought ahead, the next runs first
    if (u.staged && (u.staged_backward || training_)) {
      unstage(i);
      release.push_back(i);
    }
  }
  return release;
}

std::vector<int> UnitSchedule::let_go_of_what_can_wait() {
  std::vector<int> out;
  while (!staged_.empty()) {
    out.push_back(staged_.back());
    unstage(staged_.back());
  }
  for (int i = 0; i < units(); ++i) {
    Unit& u = units_[i];
    if (!u.held || !u.running_backward) continue;
    u.held = false;
    out.push_back(i);
  }
  return out;
}

void UnitSchedule::clear() {
  for (Unit& u : units_) u.staged = u.running = u.held = u.resident = false;
  staged_.clear();
  planned_ = false;
}

const char* UnitSchedule::holds(int unit) const {
  const Unit& u = at(unit);
  if (u.resident) return nullptr;
  if (u.held) return u.running_backward ? "in backward" : "running";
  return u.staged ? "brought ahead" : nullptr;
}

void UnitSchedule::check() const {
  const auto fail = [](const std::string& what) { throw std::logic_error(what); };
  std::size_t staged = 0;
  for (int i = 0; i < units(); ++i) {
    const Unit& u = units_[i];
    const bool listed = std::count(staged_.begin(), staged_.end(), i) == 1;
    if (u.staged != listed) fail(detail::concat("unit ", i, ": staged flag and list differ"));
    if (u.staged && (u.running || u.held)) {
      fail(detail::concat("unit ", i, " is brought ahead and running"));
    }
    if (u.held && !u.running) fail(detail::concat("unit ", i, " holds without running"));
    if (u.staged && (u.resident || in_place_)) {
      fail(detail::concat("unit ", i, " is brought ahead though it is never brought"));
    }
    if (u.staged && u.home_busy) {
      fail(detail::concat("unit ", i, " is brought ahead while a host step writes its homes"));
    }
    staged += u.staged;
  }
  if (staged != staged_.size()) fail("a unit is listed twice as brought ahead");
  if (!planned_ && !staged_.empty()) fail("units brought ahead before a plan");
  std::vector<int> last(units_.size(), -1);
  for (std::size_t k = 0; k < forward_seq_.size(); ++k) last[forward_seq_[k]] = static_cast<int>(k);
  if (last != seq_pos_) fail("a unit's place on the route is not its last run in the forwards");
}

}  // namespace torch_uvm
