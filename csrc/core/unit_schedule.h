// What decides when an offloaded module's units come to the GPU and leave
// it: the route a pass walks, the units brought ahead of it, those the pass
// went past, and what a pass's end lets go. When they step is
// unit_lifecycle.h's; what their bytes evict is residency.h's; which units
// stay resident is resident_plan.h's. Policy only, in unit ids and bytes:
// the torch glue (torch/stream_executor.h) moves the tensors it names.
//
// A unit's way through a pass:
//
//   idle --bring_ahead--> staged --begins--> running, held --ends--> idle
//   idle --begins (on demand; the glue brings it, then held())--> running
//
// * The route: the first forward's order (each unit once; plan() fixes it),
//   and, in a backward, the forwards since the last backward, retraced in
//   reverse (a routed expert, a branch taken), not the plan's order.
// * The window: the running unit and `ahead` times the largest streamed
//   unit's bytes brought ahead (the whole window beside a resident one).
//   Training, beyond it, units come while the budget has room nothing holds,
//   less what the backward's gradients and steps still need (the step room).
// * Inference's forwards wrap round: what a forward's end brought ahead, the
//   next forward runs first. Training's do not: a pass's end lets go of all.
//
// One thread's at a time: the glue's calls lock (StreamExecutor::calls_lock).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "core/residency.h"

namespace torch_uvm {

class UnitSchedule {
 public:
  // `ahead` >= 1 (InvalidArgument otherwise). `in_place`: streamed units are
  // read where they live, never brought. `training`: see above.
  UnitSchedule(const ResidencyBudget& budget, ShareId share, int ahead, bool in_place,
               bool training);

  // A unit whose step needs room for `trainable_bytes` (its parameters that
  // require grad, with their gradients and states sized by them). Returns its id.
  int add_unit(std::size_t trainable_bytes);
  void set_trainable_bytes(int unit, std::size_t bytes);
  std::size_t largest_trainable() const;
  int units() const { return static_cast<int>(units_.size()); }

  // Chosen before plan() (InvalidArgument after it).
  void set_in_place(bool in_place);
  void set_training(bool training);
  bool in_place() const { return in_place_; }
  bool training() const { return training_; }

  // The first forward's order of the units (each once, those that never ran
  // last): what plan() is given.
  std::vector<int> pass_order() const;
  // `order` (every unit once), and per place on it: resident, and the bytes
  // a streamed unit brings (a tied weight a resident unit holds is not
  // brought); the largest streamed unit sizes the window; `step_units` is
  // the step room, in the largest trainable unit still to run backward.
  void plan(const std::vector<int>& order, const std::vector<bool>& resident,
            const std::vector<std::size_t>& stream_bytes, std::size_t largest_streamed,
            std::size_t step_units);
  bool planned() const { return planned_; }
  const std::vector<int>& order() const { return order_; }
  bool resident(int unit) const { return at(unit).resident; }
  std::size_t window_bytes() const { return window_bytes_; }

  // How a unit about to run gets its tensors (begins()).
  enum class Arrival {
    kAgain,    // it runs already (a module called twice): nothing to do
    kInPlace,  // read where it lives (in_place): nothing to bring
    kStaged,   // brought ahead: its holds pass to this run
    kOnDemand  // the glue brings it now, then calls held()
  };
  struct Begin {
    Arrival arrival = Arrival::kOnDemand;
    std::vector<int> let_go;  // brought ahead, and passed by: release their holds
  };
  // The unit is about to run forward or backward. `grad_enabled`: a
  // training forward that builds a graph is the route of its backward.
  Begin begins(int unit, bool backward, bool grad_enabled);
  // Its tensors are on the GPU (brought on demand) and held by this run.
  void held(int unit);
  // After a unit's tensors are held: the next units on the route to bring
  // ahead, in order. `bring(unit, beyond)` brings one if it can (`beyond`
  // the window: only into room nothing holds) and says whether it did; the
  // first it cannot ends the walk. No-op during a forward recomputed inside
  // a backward (activation checkpointing: nothing ahead of it to bring).
  void bring_ahead(int unit, bool backward, const std::function<bool(int, bool)>& bring);
  // The unit's kernels are queued: returns whether its run held its tensors
  // (the glue releases them).
  bool ends(int unit);
  // A pass's end: the units whose holds to release (those still running,
  // and in training, or after a backward, those brought ahead).
  std::vector<int> end_pass();
  // A bring that must happen finds the budget held: the units brought ahead,
  // and those whose backward runs (their weights are not written in
  // backward: if they leave, their kernels read them in their homes), stop
  // holding. Returns them: the glue releases their holds.
  std::vector<int> let_go_of_what_can_wait();
  // Everything leaves (undo): nothing is planned, held or brought ahead.
  void clear();

  // A host step writes the unit's homes: no bring ahead copies them (the
  // unit comes on demand once its step is done).
  void set_home_busy(int unit, bool busy) { at(unit).home_busy = busy; }
  bool home_busy(int unit) const { return at(unit).home_busy; }

  // What holds a unit's tensors now: "running", "in backward", "brought
  // ahead", or nullptr (none, or resident).
  const char* holds(int unit) const;
  const std::vector<int>& staged() const { return staged_; }
  bool running(int unit) const { return at(unit).running; }
  // The room a backward at route place `at` keeps for its gradients and steps.
  std::size_t step_room(int at) const;

  // Checks the invariants (tests): throws std::logic_error naming the first broken.
  void check() const;

 private:
  struct Unit {
    bool resident = false;
    std::size_t stream_bytes = 0;     // what it brings when it streams (after plan)
    std::size_t trainable_bytes = 0;  // its parameters that require grad
    bool staged = false;              // brought ahead, not yet run: holds its tensors
    bool staged_backward = false;
    int staged_from = 0;              // the place of the unit that brought it ahead
    bool running = false;             // between begins() and ends()
    bool running_backward = false;
    bool held = false;                // running, and holding its tensors
    bool home_busy = false;
  };
  Unit& at(int unit);
  const Unit& at(int unit) const;
  // The route a pass walks: the plan's order, or, in a backward, the
  // forwards since the last one; a unit's place on it (its last, or -1).
  bool on_route(bool backward) const;
  const std::vector<int>& route(bool backward) const;
  int place(int unit, bool backward) const;
  // How far place `to` lies from `from` the way a pass runs (wrapping round
  // for inference's forwards); negative: behind it.
  int distance(int from, int to, bool backward) const;
  // Units brought ahead that the pass went past (appended to `out`).
  void let_go_of_passed(int unit, bool backward, std::vector<int>& out);
  void unstage(int unit);
  // Whether `bytes` more fit beyond the window: room nothing holds, beside
  // what a backward's steps still need.
  bool room_beyond_window(std::size_t bytes, int at, bool backward) const;

  const ResidencyBudget& budget_;
  ShareId share_;
  int ahead_;
  bool in_place_;
  bool training_;
  bool planned_ = false;
  std::size_t window_bytes_ = 0;
  std::size_t step_units_ = 0;
  std::vector<Unit> units_;
  std::vector<int> seen_;         // the units as the first forward ran them
  std::vector<int> order_;        // the forward order, once planned
  std::vector<int> position_;     // unit -> its place in order_
  std::vector<int> staged_;       // brought ahead, not yet run
  std::vector<int> forward_seq_;  // training: the units the forwards since the last backward ran
  std::vector<int> seq_pos_;      // unit -> its last place in forward_seq_, or -1
  bool in_backward_ = false;      // a backward ran since the last end_pass
};

}  // namespace torch_uvm
