// What decides when an offloaded module's units step: each unit's state
// through a training pass (its backward, its gradients, its step), and the
// pass's opening and closing. Policy only, in ids: the torch glue
// (torch_uvm/offload_training.py) carries out what it returns on the
// executor (torch/stream_executor.h), which moves the bytes.
//
// A training pass, as FSDP2's TrainingState walks it:
//
//   kIdle --backward_begins--> kBackward --gradient--> kGradients
//     --(its last gradient)--> kGradientsDone --stepped--> kStepped
//     --step_ends--> kIdle
//
// * A unit counts the gradients of the backward it is in (autograd's graph
//   task), from none, whether or not its own backward began: a tied weight
//   whose owner did not run, a regularizer over its parameters.
// * A frozen unit (no gradient expected) that a backward brought is let go
//   when the next unit's backward begins, or at the backward's end.
// * At the backward's end, units whose gradients came only in part (an
//   unused branch) are returned: their gradients go home as they are.
// * With step_in_backward a unit steps once per backward: its gradients
//   coming twice in one (reentrant checkpointing) are refused, and so is a
//   second backward before optimizer.step().
//
// Internally synchronized: the gradients come on autograd's device thread,
// the step and the pass's end on the caller's.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace torch_uvm {

enum class UnitState : std::uint8_t {
  kIdle,           // nothing of a backward, or stepped and the step ended
  kBackward,       // its backward began; none of its gradients came yet
  kGradients,      // some of its gradients of this backward came
  kGradientsDone,  // all came (or the backward ended): home, or stepping
  kStepped,        // stepped since the last step's end
};

const char* to_string(UnitState state);

class UnitLifecycle {
 public:
  // One unit per name (the names are for errors), none trainable yet.
  explicit UnitLifecycle(std::vector<std::string> names);

  // How many gradients each backward brings the unit: its parameters that
  // require grad now (0: frozen).
  void set_expected(int unit, int gradients);
  int expected(int unit) const;

  struct BackwardBegin {
    bool opened = false;        // the first unit of a backward: queue its end
    std::vector<int> released;  // frozen units whose backward is over: let go
  };
  // The unit's backward is about to run. `step_in_backward`: units step as
  // their gradients complete; then a backward opening while units stepped
  // in the last one, and no optimizer.step() since, is refused (OrderError).
  BackwardBegin backward_begins(int unit, bool step_in_backward);

  // One of the unit's gradients was accumulated, in autograd's graph task
  // `task`. Returns true when it was the last one this backward expects.
  bool gradient(int unit, std::int64_t task);

  // The unit is about to step in this backward (step_in_backward, its
  // gradients complete): refused (OrderError) if it stepped already
  // since the last step's end. Returns whether it steps on the host
  // (set_host_units).
  bool steps_in_backward(int unit);
  // It stepped (in backward, or on the host or the GPU in optimizer.step()).
  void stepped(int unit, bool in_backward);
  bool has_stepped(int unit) const;
  std::vector<int> stepped_units() const;
  // Units that stepped in backward since the last step's end (what a
  // clipping of their gradients would no longer see); none if no unit did.
  std::vector<int> stepped_in_backward() const;
  // The units to step on the host in this backward (host_step), chosen at
  // its opening.
  void set_host_units(const std::vector<int>& units);
  bool on_host(int unit) const;

  bool backward_active() const;
  // The backward's end (or a failed one's, found later): the units whose
  // gradients came only in part (they go home as they are). Frozen units
  // brought for it are let go by the caller's end of the pass.
  std::vector<int> end_backward();
  // optimizer.step() ended (or its closure failed): every unit may step
  // again. Returns those that had stepped.
  std::vector<int> step_ends();

  UnitState state(int unit) const;
  int units() const { return static_cast<int>(units_.size()); }
  // Checks the invariants (tests): throws std::logic_error naming the first broken.
  void check() const;

 private:
  struct Unit {
    std::string name;
    UnitState state = UnitState::kIdle;
    int expected = 0;
    int seen = 0;              // gradients of `task` so far
    std::int64_t task = -1;    // the backward `seen` counts in
    bool on_host = false;
  };
  Unit& at(int unit);
  const Unit& at(int unit) const;
  std::vector<int> stepped_locked() const;  // the stepped units; mutex_ held

  mutable std::mutex mutex_;
  std::vector<Unit> units_;
  bool active_ = false;               // a backward runs: its end is queued
  bool stepped_in_backward_ = false;  // a unit stepped in backward since step_ends
  std::vector<int> frozen_running_;   // brought for backward, no gradient releases them
};

}  // namespace torch_uvm
