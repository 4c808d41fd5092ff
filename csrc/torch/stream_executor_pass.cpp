// StreamExecutor (stream_executor.h): a pass, as core/unit_schedule.h
// decides it. Before each submodule runs, its tensors come (or were brought
// ahead) and the next ones on the route are brought ahead; what the pass
// went past, and what its end lets go, stop being held.
#include "torch/stream_executor.h"

#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <optional>

#include "torch/stream_ref.h"
#include "torch/trace_scope.h"

namespace torch_uvm {

void StreamExecutor::before(int unit, bool backward) {
  Unit& u = units_.at(unit);
  const UnitSchedule::Begin b = schedule_.begins(unit, backward, at::GradMode::is_enabled());
  release_units(b.let_go);
  switch (b.arrival) {
    case UnitSchedule::Arrival::kAgain:
      // Run again before its end (a module called twice): its gradients come
      // after its last run's backward, perhaps long after the first one made
      // room for them: room again now (a GAN's discriminator on real and
      // generated samples went to twice its budget while the host ran
      // ahead, its gradients going home unwaited for).
      if (backward) room_for(new_grad_bytes(u));
      return;
    case UnitSchedule::Arrival::kInPlace:  // read where it lives
      ran_at_home(u.tensors);
      return;
    case UnitSchedule::Arrival::kStaged:  // its holds pass to this run
      break;
    case UnitSchedule::Arrival::kOnDemand: {
      // the compute stream waits for it ("bring_ahead": came while an
      // earlier unit ran); what is on the GPU already is only held
      std::optional<TraceScope> scope;
      bring_entries(u.tensors, bring_stream_, false, false, [&](std::size_t bytes) {
        scope.emplace("bring", u.name, bytes, stream_ref(bring_stream_));
      });
      schedule_.held(unit);
      break;
    }
  }
  wait_ready(u.tensors);
  note_use(u.tensors);
  note_ran(u.tensors);
  schedule_.bring_ahead(unit, backward, [&](int next, bool beyond) {
    Unit& v = units_[next];
    // brought ahead only where the arena has room (it comes on demand)
    std::optional<TraceScope> scope;
    return bring_entries(v.tensors, bring_stream_, /*optional=*/true, /*if_free=*/beyond,
                         [&](std::size_t bytes) {
                           scope.emplace("bring_ahead", v.name, bytes,
                                         stream_ref(bring_stream_));
                         });
  });
  // Room for its gradients may let go of this unit too: its weights then
  // leave only if nothing else can, and its backward reads them where they
  // are. Kept held, the host would wait for copies home at every unit
  // (GPT-2 1.2B under 4 GiB, H100, 2026-11-25: 0.67 s a step against 0.48).
  if (backward) room_for(new_grad_bytes(u));
}

// Its buffers in slots may be written by this run, their versions unmoved:
// the budget counts them as written, so they go home when they leave (every
// way out asks the budget how: carry_out, evict_now).
void StreamExecutor::note_ran(const std::vector<int>& ids) {
  for (int id : ids) {
    if (entries_[id].buffer && entries_[id].tensor->in_slot()) budget_.mark_written(key(id));
  }
}

// Its buffers read in place may be written in their homes, on the compute
// stream, their versions unmoved: a bring of them waits for it
// (bring_entries), or it could copy what was there before.
void StreamExecutor::ran_at_home(const std::vector<int>& ids) {
  for (int id : ids) {
    if (entries_[id].buffer) entries_[id].written_at_home = true;
  }
}

void StreamExecutor::after(int unit) {
  if (schedule_.ends(unit)) release_units({unit});
}

void StreamExecutor::release_units(const std::vector<int>& units) {
  for (int unit : units) {
    for (int id : units_.at(unit).tensors) release(id);
  }
}

void StreamExecutor::end_pass() {
  release_units(schedule_.end_pass());
  homes_.block(stream_ref(compute()));
}

}  // namespace torch_uvm
