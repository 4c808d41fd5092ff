// StreamExecutor (stream_executor.h): a pass. Before each submodule runs,
// its tensors come (or were brought ahead) and the next ones on the route
// are brought ahead within the window: a forward's learned order, or a
// backward retracing the forward that built its graph. What a pass went
// past is let go; a pass's end releases what it held.
#include "torch/stream_executor.h"

#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <optional>

#include "torch/stream_ref.h"
#include "torch/trace_scope.h"

namespace torch_uvm {

void StreamExecutor::before(int unit, bool backward) {
  Unit& u = units_.at(unit);
  if (!planned_) seen_.push_back(unit);
  if (!backward && training_ && !in_backward_ && at::GradMode::is_enabled()) {
    seq_pos_[unit] = static_cast<int>(forward_seq_.size());  // its backward's route
    forward_seq_.push_back(unit);
  }
  in_backward_ = in_backward_ || backward;
  if (u.running) {  // run again before its end (a module called twice)
    // Its gradients come after its last run's backward, perhaps long after
    // the first one made room for them: room again now (a GAN's
    // discriminator on real and generated samples went to twice its budget
    // while the host ran ahead, its gradients going home unwaited for).
    if (backward) room_for(new_grad_bytes(u));
    return;
  }
  u.running = true;
  u.running_backward = backward;
  if (planned_) let_go_of_passed(unit, backward);
  if (in_place_ && !u.resident) {  // read where it lives
    ran_at_home(u.tensors);
    return;
  }
  if (u.staged) {
    u.staged = false;  // its holds pass to this run
    staged_.erase(std::find(staged_.begin(), staged_.end(), unit));
  } else {
    TORCH_CHECK(!u.home_busy, "torch_uvm: internal error: submodule '", u.name,
                "' was brought while a host step writes its homes; please report it");
    // on demand: the compute stream waits for it ("bring_ahead": came
    // while an earlier unit ran); what is on the GPU already is only held
    std::optional<TraceScope> scope;
    bring_entries(u.tensors, bring_stream_, false, false, [&](std::size_t bytes) {
      scope.emplace("bring", u.name, bytes, stream_ref(bring_stream_));
    });
  }
  u.held = true;
  wait_ready(u.tensors);
  note_use(u.tensors);
  note_ran(u.tensors);
  // (a forward recomputed inside a backward, activation checkpointing, runs
  // units the backward already passed: nothing to bring ahead of it)
  if (planned_ && (backward || !in_backward_)) stage_next(unit, backward);
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
  Unit& u = units_.at(unit);
  u.running = false;
  if (!u.held) return;
  u.held = false;
  for (int id : u.tensors) release(id);
}

// A backward retraces the forward that built its graph: the units that
// ran in it, in reverse (a routed expert, a branch taken), not the order of
// the plan, which only the first forward gave.
bool StreamExecutor::on_route(bool backward) const {
  return backward && !forward_seq_.empty();
}

int StreamExecutor::place(int unit, bool backward) const {
  return on_route(backward) ? seq_pos_[unit] : position_[unit];
}

int StreamExecutor::distance(int from, int to, bool backward) const {
  const int n = static_cast<int>(order_.size());
  const int d = backward ? from - to : to - from;
  return !backward && !training_ ? (d % n + n) % n : d;  // inference's forwards wrap round
}

void StreamExecutor::let_go_of_passed(int unit, bool backward) {
  const int here = place(unit, backward);
  if (here < 0) return;
  for (std::size_t k = 0; k < staged_.size();) {
    Unit& v = units_[staged_[k]];
    const int from = v.staged_from, there = place(staged_[k], backward);
    if (staged_[k] != unit && v.staged_backward == backward &&
        (there < 0 || distance(from, here, backward) > distance(from, there, backward))) {
      unstage(v);  // (removes it from staged_)
    } else {
      ++k;
    }
  }
}

void StreamExecutor::unstage(Unit& u) {
  u.staged = false;
  staged_.erase(std::find(staged_.begin(), staged_.end(), static_cast<int>(&u - units_.data())));
  for (int id : u.tensors) release(id);
}

void StreamExecutor::stage_next(int unit, bool backward) {
  const std::vector<int>& route = on_route(backward) ? forward_seq_ : order_;
  const int at = place(unit, backward);
  if (in_place_ || route.empty() || at < 0) return;
  const int n = static_cast<int>(route.size());
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
  const std::size_t running = units_[unit].resident ? 0 : units_[unit].stream_bytes;
  const std::size_t cap = window_bytes_ > running ? window_bytes_ - running : 0;
  std::size_t ahead = 0;
  for (int k = 1; k < n; ++k) {
    int j = at + (backward ? -k : k);
    if (wrap) j = (j % n + n) % n;
    if (j < 0 || j >= n) break;
    const int next = route[j];
    Unit& v = units_[next];
    if (v.resident || v.stream_bytes == 0 || place(next, backward) != j) {
      continue;  // nothing to bring, or it runs again later on the route
    }
    const bool beyond = ahead > 0 && ahead + v.stream_bytes > cap;
    if (beyond && !room_beyond_window(v.stream_bytes, at, backward)) break;
    ahead += v.stream_bytes;
    if (v.staged || v.running) continue;
    // a host step writes its homes: it comes on demand once that is done
    // (and what follows it is brought ahead from there)
    if (v.home_busy) break;
    // brought ahead only where the arena has room (it comes on demand)
    std::optional<TraceScope> scope;
    if (!bring_entries(v.tensors, bring_stream_, /*optional=*/true, /*if_free=*/beyond,
                       [&](std::size_t bytes) {
                         scope.emplace("bring_ahead", v.name, bytes, stream_ref(bring_stream_));
                       })) {
      break;
    }
    v.staged = true;
    v.staged_backward = backward;
    v.staged_from = at;
    staged_.push_back(next);
  }
}

bool StreamExecutor::room_beyond_window(std::size_t bytes, int at, bool backward) const {
  // (inference: its plan leaves no room beside the resident units and the window)
  if (!training_) return false;
  const ResidencyStats s = budget_.share_stats(share_);
  const std::size_t keep = backward ? step_room(at) : 0;
  return s.limit > 0 && s.resident_bytes + s.leaving_bytes + bytes + keep <= s.limit;
}

std::size_t StreamExecutor::step_room(int at) const {
  const std::vector<int>& route = on_route(true) ? forward_seq_ : order_;
  std::size_t largest = 0;
  for (int k = std::min(at, static_cast<int>(route.size()) - 1); k >= 0; --k) {
    std::size_t sum = 0;
    for (const at::Tensor& p : units_[route[k]].trainable) sum += p.storage().nbytes();
    largest = std::max(largest, sum);
  }
  return step_units_ * largest;
}

void StreamExecutor::end_pass() {
  // a backward's end closes the route it retraced; forwards whose backward
  // never came (graphs built and dropped) do not pile up
  if (in_backward_ || forward_seq_.size() > 4 * units_.size()) {
    for (int u : forward_seq_) seq_pos_[u] = -1;
    forward_seq_.clear();
    in_backward_ = false;
  }
  for (Unit& u : units_) {
    if (u.running) after(static_cast<int>(&u - units_.data()));
    // inference's forwards wrap round: what the last brought ahead, the next runs first
    if (u.staged && (u.staged_backward || training_)) unstage(u);
  }
  homes_written_.block(stream_ref(compute()));
}

}  // namespace torch_uvm
