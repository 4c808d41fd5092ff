// StreamExecutor (stream_executor.h): its memory. Every bring draws its
// slots from one range the budget's size (the arena); what leaves is
// dropped or written home; copies home under way count in the budget until
// they pass, and room is made before memory is drawn or made. A bring that
// must happen and finds the budget held lets go of what can wait.
#include "torch/stream_executor.h"

#include <algorithm>

#include "core/errors.h"
#include "core/slot_arena.h"
#include "torch/state.h"
#include "torch/stream_ref.h"
#include "torch/trace_scope.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {

void StreamExecutor::carry_out(const std::vector<EvictionStep>& steps) {
  if (steps.empty()) return;
  std::vector<int> ids;
  for (const EvictionStep& s : steps) ids.push_back(by_key_.at(s.address));
  record_done(ids);
  Wrote wrote;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    leave(ids[k], steps[k].how == Eviction::kWriteHome, wrote);
  }
  homes_.queued(wrote.bytes, wrote.beside, stream_ref(home_stream_));
}

// Memory the GPU is about to make for the share (a unit's gradients, an
// optimizer's first states) is not drawn by a bring: room is made for it
// just before the work that makes it, so the books never pass the budget
// when it is adopted.
void StreamExecutor::room_for(std::size_t bytes) {
  if (bytes == 0) return;
  homes_.reap();
  carry_out(budget_.make_room(device_.index(), share_, bytes));
  const ResidencyStats s = budget_.share_stats(share_);
  if (s.resident_bytes + bytes > s.limit && let_go_of_what_can_wait()) {
    carry_out(budget_.make_room(device_.index(), share_, bytes));
  }
  homes_.make_room(bytes);
}

// The books have room for slots of `sizes`; the arena may not, in one piece
// each: its least recently used ranges leave until they fit. Empty when
// none is left.
std::vector<c10::Storage> StreamExecutor::arena_slots(const std::vector<std::size_t>& sizes) {
  const auto in_arena = [this](std::uintptr_t address) {
    return entries_[by_key_.at(address)].tensor->in_arena();
  };
  while (true) {
    std::vector<c10::Storage> slots = allocate_arena_slots(sizes, *arena_);
    if (!slots.empty()) return slots;
    const auto step = budget_.evict_least_recent(device_.index(), share_, in_arena);
    if (!step) return slots;
    TraceScope scope("arena_room", "", step->bytes);
    carry_out({*step});
  }
}

void StreamExecutor::leave(int id, bool written, Wrote& wrote) {
  StreamedTensor& t = *entries_[id].tensor;
  written = written || t.changed() || !t.has_home();
  TraceScope scope(written ? "write_home" : "drop", entries_[id].name, t.nbytes(),
                   stream_ref(home_stream_));
  const bool beside = !t.in_arena();
  if (t.leave(written, compute_done_, streams_of(id), home_stream_)) {
    wrote.bytes += t.nbytes();
    if (beside) wrote.beside += t.nbytes();
  }
  entries_[id].used_on.clear();  // its slot is gone: no stream uses it now
}

bool StreamExecutor::bring_entries(const std::vector<int>& ids, c10::cuda::CUDAStream stream,
                                   bool optional, bool if_free,
                                   const std::function<void(std::size_t)>& copying) {
  optional = optional || if_free;
  // A home written in place on the compute stream (DDP's averaged gradient,
  // a buffer its unit's run read in place: ran_at_home) is copied after
  // that write.
  bool wait = false;
  for (int id : ids) {
    wait = wait || entries_[id].written_at_home || entries_[id].tensor->written_at_home();
    entries_[id].written_at_home = false;
  }
  if (wait) {
    record_done(ids);
    compute_done_.block(stream_ref(stream));
  }
  if (!arena_) arena_ = make_slot_arena(arena_bytes(budget_.share_stats(share_).limit),
                                        bring_stream_);
  homes_.reap();  // copies home that passed leave room: nothing evicted for them
  std::vector<int> held, coming;
  std::size_t brought = 0;
  auto ready = std::make_shared<RuntimeEvent>(allocator().runtime());
  try {
    for (int id : ids) {
      // admitted (touched, if resident), then held: a later one of `ids`
      // cannot evict it
      std::vector<EvictionStep> steps;
      try {
        steps = admit(id, !optional);
      } catch (const InvalidArgument&) {
        if (!optional) throw;
        for (int c : coming) budget_.withdraw(key(c));  // not now: the budget is held
        for (int h : held) release(h);
        return false;
      }
      hold(id);
      held.push_back(id);
      if (!entries_[id].tensor->in_slot()) coming.push_back(id);
      carry_out(steps);
    }
    if (coming.empty()) return true;
    homes_.make_room();
    std::vector<std::size_t> sizes;
    for (int id : coming) sizes.push_back(entries_[id].tensor->nbytes());
    // (beyond the window: the arena's free ranges alone, nothing leaves,
    // and the host does not wait for the GPU to pass slots let go)
    std::vector<c10::Storage> slots =
        if_free ? allocate_arena_slots(sizes, *arena_, /*wait=*/false) : arena_slots(sizes);
    if (slots.empty()) {
      if (optional) {  // not now: the arena has no room for them in one piece
        for (int id : coming) budget_.withdraw(key(id));
        for (int id : held) release(id);
        return false;
      }
      slots = allocate_slots_beside(sizes, *arena_);
    }
    if (copying) {
      std::size_t bytes = 0;
      for (std::size_t s : sizes) bytes += s;
      copying(bytes);
    }
    for (; brought < coming.size(); ++brought) {
      StreamedTensor& t = *entries_[coming[brought]].tensor;
      t.bring(stream, std::move(slots[brought]));
      t.ready = ready;
    }
    ready->record(stream_ref(stream));
  } catch (...) {
    if (brought > 0) ready->record(stream_ref(stream));  // those brought: filled once it passes
    for (std::size_t k = brought; k < coming.size(); ++k) budget_.forget(key(coming[k]));
    for (int id : held) release(id);
    throw;
  }
  return true;
}

void StreamExecutor::wait_ready(const std::vector<int>& ids) {
  const StreamRef c = stream_ref(compute());
  for (int id : ids) {
    auto& ready = entries_[id].tensor->ready;
    if (ready) {
      ready->block(c);
      ready.reset();
    }
  }
}

// The most the share's slots can hold at once: its budget, or everything
// it streams if that is less: the weights, and when it trains, its
// parameters' gradients and an optimizer's two states each (one that keeps
// more draws the rest beside the arena, counted as its misses). Inference
// with a budget above the weights draws the weights' bytes, not the budget.
std::size_t StreamExecutor::arena_bytes(std::size_t budget) const {
  constexpr std::size_t kStatesPerParameter = 2;
  std::size_t all = 0;  // each tensor as a slot of the arena takes it
  for (const Entry& e : entries_) all += SlotArena::block_bytes(e.tensor->nbytes());
  for (const Unit& u : units_) {
    for (const at::Tensor& p : u.trainable) {
      all += schedule_.training() ? (1 + kStatesPerParameter) * SlotArena::block_bytes(p.storage().nbytes())
                       : 0;
    }
  }
  constexpr std::size_t kRound = 2 << 20;  // PyTorch's allocator's large rounding
  return std::min(budget, (all + kRound - 1) / kRound * kRound);
}

std::vector<EvictionStep> StreamExecutor::admit(int id, bool required) {
  const std::size_t bytes = entries_[id].tensor->nbytes();
  for (bool again = false;; again = true) {
    try {
      return budget_.admit(device_.index(), key(id), bytes, false, share_);
    } catch (const InvalidArgument& e) {
      if (!required) throw;
      if (again || !let_go_of_what_can_wait()) {
        throw InvalidArgument(detail::concat(e.what(), "; holding it: ", holders()));
      }
    }
  }
}

bool StreamExecutor::let_go_of_what_can_wait() {
  const std::vector<int> let_go = schedule_.let_go_of_what_can_wait();
  release_units(let_go);
  return !let_go.empty();
}

void StreamExecutor::evict_now(const std::vector<int>& ids) {
  record_done(ids);
  Wrote wrote;
  for (int id : ids) {
    Entry& e = entries_[id];
    if (e.pinned || e.holds > 0 || !e.tensor->in_slot()) continue;
    const auto how = budget_.evict(key(id));
    leave(id, how == Eviction::kWriteHome, wrote);
  }
  homes_.queued(wrote.bytes, wrote.beside, stream_ref(home_stream_));
}

void StreamExecutor::evict_unused() {
  std::vector<int> all(entries_.size());
  for (std::size_t id = 0; id < all.size(); ++id) all[id] = static_cast<int>(id);
  evict_now(all);
  homes_.block(stream_ref(compute()));
}

void StreamExecutor::evict_unit(int unit) { evict_now(units_.at(unit).tensors); }

void StreamExecutor::evict_all() {
  schedule_.clear();
  for (Entry& e : entries_) {
    e.holds = 0;
    e.pinned = false;
    budget_.set_busy(reinterpret_cast<std::uintptr_t>(e.tensor.get()), false);
  }
  step_held_.clear();
  evict_unused();
  arena_.reset();  // its memory goes back once its last slot is gone
}

}  // namespace torch_uvm
