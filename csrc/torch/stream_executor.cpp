#include "torch/stream_executor.h"

#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <unordered_set>

#include "torch/state.h"
#include "torch/stream_ref.h"
#include "torch/trace_scope.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

// Optimizer states smaller than this (a step count) stay where the
// optimizer put them: moving them would cost more calls than bytes.
constexpr std::size_t kSmallestStreamed = 64 << 10;

}  // namespace

StreamExecutor::StreamExecutor(ResidencyBudget& budget, ShareId share, c10::Device device,
                               int ahead, bool in_place, bool training)
    : budget_(budget),
      share_(share),
      device_(device),
      ahead_(ahead),
      in_place_(in_place),
      training_(training),
      bring_stream_(c10::cuda::getStreamFromPool(false, device.index())),
      home_stream_(c10::cuda::getStreamFromPool(false, device.index())),
      compute_done_(allocator().runtime()),
      homes_written_(allocator().runtime()),
      step_inputs_(allocator().runtime()) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "torch_uvm: streaming needs a GPU");
  TORCH_CHECK(ahead >= 1, "torch_uvm: ahead must be at least 1");
}

// Dropped with tensors on the GPU (an offload collected without undo): the
// slots go back to the allocator once every stream that used them passed.
StreamExecutor::~StreamExecutor() {
  std::vector<c10::cuda::CUDAStream> streams = compute_streams_;
  streams.push_back(bring_stream_);
  streams.push_back(home_stream_);
  for (Entry& e : entries_) {
    budget_.unlabel(reinterpret_cast<std::uintptr_t>(e.tensor.get()));
    try {
      e.tensor->let_go(streams);
    } catch (...) {
    }
  }
}

c10::cuda::CUDAStream StreamExecutor::compute() const {
  return c10::cuda::getCurrentCUDAStream(device_.index());
}

void StreamExecutor::note_compute() {
  const auto c = compute();
  if (std::find(compute_streams_.begin(), compute_streams_.end(), c) == compute_streams_.end()) {
    compute_streams_.push_back(c);
  }
}

// What leaves next waits for every compute stream's work so far, not only
// the current one's: a step run on a stream of its own may still be writing
// a slot that the main stream's next bring evicts.
void StreamExecutor::record_compute_done() {
  note_compute();
  std::vector<StreamRef> refs;
  for (const auto& c : compute_streams_) refs.push_back(stream_ref(c));
  compute_done_.record(refs);
}

int StreamExecutor::entry_for(const at::Tensor& t) const {
  auto it = by_target_.find(t.unsafeGetTensorImpl());
  return it == by_target_.end() ? -1 : it->second;
}

int StreamExecutor::add_entry(const at::Tensor& target, StreamedTensor::Memory memory,
                              std::string name) {
  Entry e;
  e.tensor = std::make_unique<StreamedTensor>(target, memory);
  e.name = std::move(name);
  budget_.label(reinterpret_cast<std::uintptr_t>(e.tensor.get()), e.name);  // in timelines
  entries_.push_back(std::move(e));
  const int id = static_cast<int>(entries_.size()) - 1;
  by_target_[target.unsafeGetTensorImpl()] = id;
  by_key_[key(id)] = id;
  return id;
}

int StreamExecutor::add_unit(const std::string& name, const std::vector<at::Tensor>& targets,
                             const std::vector<at::Tensor>& trainable) {
  Unit u;
  u.name = name;
  for (const at::Tensor& t : targets) {
    int id = entry_for(t);
    if (id < 0) id = add_entry(t, StreamedTensor::Memory::kHome, name);
    if (std::find(u.tensors.begin(), u.tensors.end(), id) == u.tensors.end()) {
      u.tensors.push_back(id);
    }
  }
  u.trainable = trainable;
  u.grads.assign(trainable.size(), -1);
  units_.push_back(std::move(u));
  return static_cast<int>(units_.size()) - 1;
}

std::size_t StreamExecutor::unit_bytes(int unit) const {
  std::size_t sum = 0;
  for (int id : units_.at(unit).tensors) sum += entries_[id].tensor->nbytes();
  return sum;
}

std::size_t StreamExecutor::bytes_on_gpu(int unit) const {
  std::size_t sum = 0;
  for (int id : units_.at(unit).tensors) {
    if (entries_[id].tensor->in_slot()) sum += entries_[id].tensor->nbytes();
  }
  return sum;
}

void StreamExecutor::hold(int id) {
  if (entries_[id].holds++ == 0) budget_.set_busy(key(id), true);
}

void StreamExecutor::release(int id) {
  Entry& e = entries_[id];
  if (e.holds > 0 && --e.holds == 0 && !e.pinned) budget_.set_busy(key(id), false);
}

void StreamExecutor::carry_out(const std::vector<EvictionStep>& steps) {
  if (steps.empty()) return;
  record_compute_done();
  std::size_t wrote = 0;
  for (const EvictionStep& s : steps) {
    const int id = by_key_.at(s.address);
    if (leave(id, s.how == Eviction::kWriteHome)) wrote += entries_[id].tensor->nbytes();
  }
  note_homes(wrote);
}

void StreamExecutor::note_homes(std::size_t bytes) {
  if (bytes == 0) return;
  homes_written_.record(stream_ref(home_stream_));
  auto done = std::make_unique<RuntimeEvent>(allocator().runtime());
  done->record(stream_ref(home_stream_));
  budget_.leaving(device_.index(), share_, bytes);
  homes_pending_.emplace_back(std::move(done), bytes);
}

void StreamExecutor::pass_home() {
  budget_.left(device_.index(), share_, homes_pending_.front().second);
  homes_pending_.pop_front();
}

void StreamExecutor::reap_homes() {
  while (!homes_pending_.empty() && homes_pending_.front().first->done()) pass_home();
}

// A slot let go with its copy home under way is freed by the allocator once
// the copy passes; drawn before that, a new slot would be new memory. The
// budget counts such bytes as leaving until then: while they hold the share
// over its budget, the host waits for the oldest copy. The GPU then holds
// no more than the budget, in memory as in the books.
void StreamExecutor::make_room(std::size_t extra) {
  reap_homes();
  while (!homes_pending_.empty() && budget_.excess(device_.index(), share_, extra) > 0) {
    TraceScope scope("wait_for_home", "", homes_pending_.front().second);
    homes_pending_.front().first->wait();
    pass_home();
  }
}

// Memory the GPU is about to make for the share (a unit's gradients, an
// optimizer's first states) is not drawn by a bring: room is made for it
// just before the work that makes it, so the books never pass the budget
// when it is adopted.
void StreamExecutor::room_for(std::size_t bytes) {
  if (bytes == 0) return;
  reap_homes();
  carry_out(budget_.make_room(device_.index(), share_, bytes));
  make_room(bytes);
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

bool StreamExecutor::leave(int id, bool written) {
  StreamedTensor& t = *entries_[id].tensor;
  written = written || t.changed() || !t.has_home();
  TraceScope scope(written ? "write_home" : "drop", entries_[id].name, t.nbytes(),
                   stream_ref(home_stream_));
  return t.leave(written, compute_done_, compute_streams_, home_stream_);
}

bool StreamExecutor::bring_entries(const std::vector<int>& ids, c10::cuda::CUDAStream stream,
                                   bool optional) {
  // A home written in place on the compute stream (DDP's averaged gradient)
  // is copied after that write.
  for (int id : ids) {
    if (entries_[id].tensor->written_at_home()) {
      record_compute_done();
      compute_done_.block(stream_ref(stream));
      break;
    }
  }
  if (!arena_) arena_ = make_slot_arena(arena_bytes(budget_.share_stats(share_).limit),
                                        bring_stream_);
  reap_homes();  // copies home that passed leave room: nothing evicted for them
  std::vector<int> held, coming;
  std::size_t brought = 0;
  auto ready = std::make_shared<RuntimeEvent>(allocator().runtime());
  try {
    for (int id : ids) {
      // admitted (touched, if resident), then held: a later one of `ids`
      // cannot evict it
      const auto steps = budget_.admit(device_.index(), key(id), entries_[id].tensor->nbytes(),
                                       false, share_);
      hold(id);
      held.push_back(id);
      if (!entries_[id].tensor->in_slot()) coming.push_back(id);
      carry_out(steps);
    }
    if (coming.empty()) return true;
    make_room();
    std::vector<std::size_t> sizes;
    for (int id : coming) sizes.push_back(entries_[id].tensor->nbytes());
    std::vector<c10::Storage> slots = arena_slots(sizes);
    if (slots.empty()) {
      if (optional) {  // not now: the arena has no room for them in one piece
        for (int id : coming) budget_.withdraw(key(id));
        for (int id : held) release(id);
        return false;
      }
      slots = allocate_slots_beside(sizes, *arena_);
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
  std::size_t all = 0;
  for (const Entry& e : entries_) all += e.tensor->nbytes();
  for (const Unit& u : units_) {
    for (const at::Tensor& p : u.trainable) {
      all += training_ ? (1 + kStatesPerParameter) * p.storage().nbytes() : 0;
    }
  }
  constexpr std::size_t kRound = 2 << 20;  // PyTorch's allocator's large rounding
  return std::min(budget, (all + kRound - 1) / kRound * kRound);
}

std::vector<int> StreamExecutor::pass_order() const {
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

ResidentPlan StreamExecutor::plan_for(const std::vector<int>& order, std::size_t per_streamed,
                                      std::size_t per_any) const {
  std::vector<std::vector<int>> pieces;  // per unit in order: its entries
  for (int u : order) pieces.push_back(units_[u].tensors);
  std::vector<std::size_t> piece_bytes;
  for (const Entry& e : entries_) piece_bytes.push_back(e.tensor->nbytes());
  // For inference the streamed units run first (core/resident_plan.h,
  // ResidentAt); a backward ends on the resident ones.
  return plan_resident(pieces, piece_bytes, budget_.share_stats(share_).limit,
                       Window{per_streamed, per_any},
                       training_ ? ResidentAt::kStart : ResidentAt::kEnd);
}

std::size_t StreamExecutor::streamed_per_pass(std::size_t per_streamed,
                                              std::size_t per_any) const {
  const ResidentPlan p = plan_for(pass_order(), per_streamed, per_any);
  std::size_t sum = 0;
  for (std::size_t b : p.stream_bytes) sum += b;
  return sum;
}

void StreamExecutor::set_in_place(bool in_place) {
  TORCH_CHECK(!planned_, "torch_uvm: how an offload streams is chosen before its plan");
  in_place_ = in_place;
}

void StreamExecutor::plan(std::size_t per_streamed, std::size_t per_any) {
  TraceScope scope("plan", "", budget_.share_stats(share_).limit);
  // The first forward's slots leave, and the resident units come first into
  // the empty arena: in one piece at its start, with the ring after them.
  evict_unused();
  reap_homes();
  order_ = pass_order();
  position_.assign(units_.size(), 0);
  for (std::size_t i = 0; i < order_.size(); ++i) position_[order_[i]] = static_cast<int>(i);
  const ResidentPlan planned = plan_for(order_, per_streamed, per_any);
  const std::vector<bool>& resident = planned.resident;
  for (std::size_t i = 0; i < order_.size(); ++i) {
    Unit& u = units_[order_[i]];
    u.resident = resident[i];
    u.stream_bytes = planned.stream_bytes[i];  // a tied weight held resident is not brought
    if (!u.resident) continue;
    bring_entries(u.tensors, bring_stream_);
    for (int id : u.tensors) {
      entries_[id].pinned = true;
      release(id);
    }
  }
  window_bytes_ = static_cast<std::size_t>(ahead_ + 1) * planned.largest_streamed;
  for (Unit& u : units_) {
    if (u.resident) wait_ready(u.tensors);
  }
  planned_ = true;
}

void StreamExecutor::before(int unit, bool backward) {
  Unit& u = units_.at(unit);
  if (!planned_) seen_.push_back(unit);
  if (u.running) return;  // run again before its end (a module called twice)
  u.running = true;
  note_compute();
  if (in_place_ && !u.resident) return;  // read where it lives
  if (u.staged) {
    u.staged = false;  // its holds pass to this run
  } else {
    TraceScope scope("bring", u.name, [&] { return unit_bytes(unit); }, stream_ref(bring_stream_));
    bring_entries(u.tensors, bring_stream_);
  }
  u.held = true;
  wait_ready(u.tensors);
  if (planned_) stage_next(unit, backward);
  if (backward) room_for(new_grad_bytes(u));
}

std::size_t StreamExecutor::new_grad_bytes(const Unit& u) const {
  std::size_t sum = 0;
  for (const at::Tensor& p : u.trainable) {
    if (!p.grad().defined()) sum += p.storage().nbytes();
  }
  return sum;
}

void StreamExecutor::after(int unit) {
  Unit& u = units_.at(unit);
  u.running = false;
  if (!u.held) return;
  u.held = false;
  for (int id : u.tensors) release(id);
}

void StreamExecutor::stage_next(int unit, bool backward) {
  if (in_place_ || order_.empty()) return;
  const int n = static_cast<int>(order_.size());
  const bool wrap = !backward && !training_;
  // The window holds the running unit and what is brought ahead: `ahead`
  // units' worth of bytes beside a streamed one, the whole window beside a
  // resident one (a pass's resident end brings the next pass's first
  // units meanwhile). Counted in bytes, small units (a norm's weight) do
  // not stop the link ahead of a large one.
  const std::size_t running = units_[unit].resident ? 0 : units_[unit].stream_bytes;
  const std::size_t cap = window_bytes_ > running ? window_bytes_ - running : 0;
  std::size_t ahead = 0;
  for (int k = 1; k < n; ++k) {
    int j = position_[unit] + (backward ? -k : k);
    if (wrap) j = (j % n + n) % n;
    if (j < 0 || j >= n) break;
    Unit& v = units_[order_[j]];
    if (v.resident || v.stream_bytes == 0) continue;  // nothing to bring
    if (ahead > 0 && ahead + v.stream_bytes > cap) break;
    ahead += v.stream_bytes;
    if (v.staged || v.running) continue;
    TraceScope scope("bring", v.name, [&] { return unit_bytes(order_[j]); },
                     stream_ref(bring_stream_));
    // brought ahead only where the arena has room (it comes on demand)
    if (!bring_entries(v.tensors, bring_stream_, /*optional=*/true)) break;
    v.staged = true;
    v.staged_backward = backward;
  }
}

void StreamExecutor::adopt(int id) {
  StreamedTensor& t = *entries_[id].tensor;
  reap_homes();
  t.adopt();
  carry_out(budget_.admit(device_.index(), key(id), t.nbytes(), true, share_, false));
}

void StreamExecutor::grads_ready(int unit, bool send_home) {
  Unit& u = units_.at(unit);
  std::vector<int> fresh;
  for (std::size_t k = 0; k < u.trainable.size(); ++k) {
    at::Tensor g = u.trainable[k].grad();
    if (!g.defined() || entry_for(g) >= 0) continue;  // none, or accumulated where it is
    TORCH_CHECK(g.is_cuda() && g.storage_offset() == 0 &&
                    g.storage().nbytes() == static_cast<std::size_t>(g.nbytes()),
                "torch_uvm: the gradient of '", u.name, "' shares its memory with other "
                "tensors; torch_uvm streams gradients that own their memory");
    int& gid = u.grads[k];
    if (gid < 0) {
      gid = add_entry(g, StreamedTensor::Memory::kSlot, u.name + ".grad");
      reap_homes();
      carry_out(budget_.admit(device_.index(), key(gid), g.nbytes(), true, share_, false));
    } else {
      Entry& e = entries_[gid];
      if (e.tensor->has_target()) by_target_.erase(e.tensor->target().unsafeGetTensorImpl());
      if (e.tensor->in_slot()) {  // the last step's, still on the GPU: it died
        budget_.discard(key(gid));
        note_compute();
        e.tensor->abandon(compute_streams_);
      }
      e.tensor->retarget(g);
      by_target_[g.unsafeGetTensorImpl()] = gid;
      adopt(gid);
    }
    fresh.push_back(gid);
  }
  if (send_home && !fresh.empty()) {
    evict_now(fresh);  // adopted written: they go home
    // .grad now points at its home while the copy there is under way: what
    // the compute stream does next with it (DDP copies it into a bucket,
    // then writes the averaged gradient back) comes after the copy
    homes_written_.block(stream_ref(compute()));
  }
  after(unit);
}

void StreamExecutor::discard_grads(int unit) {
  for (int gid : units_.at(unit).grads) {
    if (gid < 0) continue;
    Entry& e = entries_[gid];
    if (!e.tensor->has_target()) continue;
    TraceScope scope("discard", e.name, e.tensor->nbytes());  // dies on the GPU: no copy
    by_target_.erase(e.tensor->target().unsafeGetTensorImpl());
    budget_.discard(key(gid));
    note_compute();
    e.tensor->abandon(compute_streams_);
  }
}

void StreamExecutor::step_begins() { step_inputs_.record(stream_ref(compute())); }

void StreamExecutor::bring(const std::vector<at::Tensor>& tensors, std::size_t new_bytes) {
  std::vector<int> ids;
  for (const at::Tensor& t : tensors) {
    const int id = entry_for(t);
    if (id >= 0 && entries_[id].tensor->has_target()) ids.push_back(id);
  }
  note_compute();  // a step may run on a stream of its own (step_in_backward)
  auto bytes = [&] {
    std::size_t sum = 0;
    for (int id : ids) sum += entries_[id].tensor->nbytes();
    return sum;
  };
  static const std::string kNone;
  TraceScope scope("bring_for_step", ids.empty() ? kNone : entries_[ids.front()].name, bytes,
                   stream_ref(bring_stream_));
  step_inputs_.block(stream_ref(bring_stream_));  // (a step in backward: long done)
  bring_entries(ids, bring_stream_);
  wait_ready(ids);
  try {
    room_for(new_bytes);  // after the bring: its admits must not take the room
  } catch (...) {
    for (int id : ids) release(id);
    throw;
  }
  step_held_.insert(step_held_.end(), ids.begin(), ids.end());
}

void StreamExecutor::step_done(const std::vector<at::Tensor>& tensors,
                               const std::vector<at::Tensor>& written) {
  std::vector<int> ids;
  std::string owner = "optimizer";  // new states are named by the step's first weight
  for (const at::Tensor& t : tensors) {
    if (const int id = entry_for(t); id >= 0) {
      owner = entries_[id].name;
      break;
    }
  }
  for (const at::Tensor& t : tensors) {
    int id = entry_for(t);
    if (id < 0) {  // made by the step (an optimizer state): on the GPU now
      if (!t.is_cuda() || t.storage_offset() != 0 || t.nbytes() < kSmallestStreamed ||
          t.storage().nbytes() != static_cast<std::size_t>(t.nbytes())) {
        continue;
      }
      id = add_entry(t, StreamedTensor::Memory::kSlot, owner + ".state");
      reap_homes();
      carry_out(budget_.admit(device_.index(), key(id), t.nbytes(), true, share_, false));
    }
    ids.push_back(id);
  }
  for (const at::Tensor& t : written) {
    const int id = entry_for(t);
    if (id >= 0) budget_.mark_written(key(id));
  }
  std::vector<int> held;
  held.swap(step_held_);
  for (int id : held) release(id);
  evict_now(ids);
}

void StreamExecutor::end_pass() {
  for (Unit& u : units_) {
    if (u.running) after(static_cast<int>(&u - units_.data()));
    if (u.staged && u.staged_backward) {
      u.staged = false;
      for (int id : u.tensors) release(id);
    }
  }
  homes_written_.block(stream_ref(compute()));
}

void StreamExecutor::evict_now(const std::vector<int>& ids) {
  record_compute_done();
  std::size_t wrote = 0;
  for (int id : ids) {
    Entry& e = entries_[id];
    if (e.pinned || e.holds > 0 || !e.tensor->in_slot()) continue;
    const auto how = budget_.evict(key(id));
    if (leave(id, how == Eviction::kWriteHome)) wrote += e.tensor->nbytes();
  }
  note_homes(wrote);
}

void StreamExecutor::evict_unused() {
  std::vector<int> all(entries_.size());
  for (std::size_t id = 0; id < all.size(); ++id) all[id] = static_cast<int>(id);
  evict_now(all);
  homes_written_.block(stream_ref(compute()));
}

void StreamExecutor::evict_all() {
  for (Unit& u : units_) {
    u.staged = u.running = u.held = false;
    u.resident = false;
  }
  for (Entry& e : entries_) {
    e.holds = 0;
    e.pinned = false;
    budget_.set_busy(reinterpret_cast<std::uintptr_t>(e.tensor.get()), false);
  }
  step_held_.clear();
  planned_ = false;
  evict_unused();
  arena_.reset();  // its memory goes back once its last slot is gone
}

}  // namespace torch_uvm
