#include "torch/stream_executor.h"

#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "core/errors.h"
#include "core/slot_arena.h"
#include "torch/pinned_home.h"
#include "torch/state.h"
#include "torch/stream_ref.h"
#include "torch/trace_scope.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

// Whether `t` owns all of its storage from its start (a streamed tensor
// takes the whole storage) and is large enough to be worth streaming.
bool streamable(const at::Tensor& t) {
  return t.is_cuda() && t.storage_offset() == 0 &&
         t.nbytes() >= StreamExecutor::kSmallestStreamed &&
         t.storage().nbytes() == static_cast<std::size_t>(t.nbytes());
}

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
  for (Entry& e : entries_) {
    budget_.unlabel(reinterpret_cast<std::uintptr_t>(e.tensor.get()));
    std::vector<c10::cuda::CUDAStream> streams = e.used_on;
    streams.push_back(bring_stream_);
    streams.push_back(home_stream_);
    try {
      e.tensor->let_go(streams);
    } catch (...) {
    }
  }
}

c10::cuda::CUDAStream StreamExecutor::compute() const {
  return c10::cuda::getCurrentCUDAStream(device_.index());
}

void StreamExecutor::note_use(const std::vector<int>& ids) {
  const auto c = compute();
  for (int id : ids) {
    auto& on = entries_[id].used_on;
    if (std::find(on.begin(), on.end(), c) == on.end()) on.push_back(c);
  }
}

std::vector<c10::cuda::CUDAStream> StreamExecutor::streams_of(int id) const {
  std::vector<c10::cuda::CUDAStream> streams = entries_[id].used_on;
  const auto c = compute();
  if (std::find(streams.begin(), streams.end(), c) == streams.end()) streams.push_back(c);
  return streams;
}

// What leaves next waits for the work of every stream its slot was used on,
// not only the current one's: a step run on a stream of its own may still
// be writing a slot that the main stream's next bring evicts.
void StreamExecutor::record_done(const std::vector<int>& ids) {
  std::vector<StreamRef> refs{stream_ref(compute())};
  for (int id : ids) {
    for (const auto& s : entries_[id].used_on) {
      const StreamRef r = stream_ref(s);
      if (std::find(refs.begin(), refs.end(), r) == refs.end()) refs.push_back(r);
    }
  }
  compute_done_.record(refs);
}

void StreamExecutor::abandon(int id) {
  entries_[id].tensor->abandon(streams_of(id));
  entries_[id].used_on.clear();
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
  seq_pos_.push_back(-1);
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
  std::vector<int> ids;
  for (const EvictionStep& s : steps) ids.push_back(by_key_.at(s.address));
  record_done(ids);
  std::size_t wrote = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (leave(ids[k], steps[k].how == Eviction::kWriteHome)) {
      wrote += entries_[ids[k]].tensor->nbytes();
    }
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
  const ResidencyStats s = budget_.share_stats(share_);
  if (s.resident_bytes + bytes > s.limit && let_go_of_what_can_wait()) {
    carry_out(budget_.make_room(device_.index(), share_, bytes));
  }
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
  const bool home = t.leave(written, compute_done_, streams_of(id), home_stream_);
  entries_[id].used_on.clear();  // its slot is gone: no stream uses it now
  return home;
}

bool StreamExecutor::bring_entries(const std::vector<int>& ids, c10::cuda::CUDAStream stream,
                                   bool optional) {
  // A home written in place on the compute stream (DDP's averaged gradient)
  // is copied after that write.
  for (int id : ids) {
    if (entries_[id].tensor->written_at_home()) {
      record_done(ids);
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
  std::size_t all = 0;  // each tensor as a slot of the arena takes it
  for (const Entry& e : entries_) all += SlotArena::block_bytes(e.tensor->nbytes());
  for (const Unit& u : units_) {
    for (const at::Tensor& p : u.trainable) {
      all += training_ ? (1 + kStatesPerParameter) * SlotArena::block_bytes(p.storage().nbytes())
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
  bool any = !staged_.empty();
  while (!staged_.empty()) unstage(units_[staged_.back()]);
  for (Unit& u : units_) {
    if (!u.held || !u.running_backward) continue;
    u.held = false;
    for (int id : u.tensors) release(id);
    any = true;
  }
  return any;
}

std::string StreamExecutor::holders() const {
  std::ostringstream os;
  std::size_t resident = 0;
  int shown = 0;
  for (const Unit& u : units_) {
    if (u.resident) {
      resident += unit_bytes(static_cast<int>(&u - units_.data()));
      continue;
    }
    const char* why = u.held ? (u.running_backward ? "in backward" : "running")
                    : u.staged ? "brought ahead" : nullptr;
    if (!why) continue;
    if (shown++ < 8) {
      os << (shown > 1 ? ", " : "") << "'" << u.name << "' (" << why << ", "
         << format_bytes(unit_bytes(static_cast<int>(&u - units_.data()))) << ")";
    }
  }
  if (shown > 8) os << " and " << shown - 8 << " more";
  if (shown == 0) os << "no streamed unit";
  os << "; resident units: " << format_bytes(resident);
  if (!step_held_.empty()) os << "; an optimizer step's tensors";
  return os.str();
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
                       Window{per_streamed, per_any * largest_trainable()},
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

void StreamExecutor::set_training(bool training) {
  TORCH_CHECK(!planned_, "torch_uvm: whether an offload trains is set before its plan");
  training_ = training;
}

void StreamExecutor::set_trainable(int unit, const std::vector<at::Tensor>& trainable) {
  Unit& u = units_.at(unit);
  std::vector<int> grads;
  for (const at::Tensor& p : trainable) {  // frozen and unfrozen again: its gradient's home
    const auto it = u.grad_ids.find(p.unsafeGetTensorImpl());
    grads.push_back(it == u.grad_ids.end() ? -1 : it->second);
  }
  u.trainable = trainable;
  u.grads = std::move(grads);
}

std::size_t StreamExecutor::largest_trainable() const {
  std::size_t largest = 0;
  for (const Unit& u : units_) {
    std::size_t sum = 0;
    for (const at::Tensor& p : u.trainable) sum += p.storage().nbytes();
    largest = std::max(largest, sum);
  }
  return largest;
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
  if (!backward && training_ && !in_backward_ && at::GradMode::is_enabled()) {
    seq_pos_[unit] = static_cast<int>(forward_seq_.size());  // its backward's route
    forward_seq_.push_back(unit);
  }
  in_backward_ = in_backward_ || backward;
  if (u.running) return;  // run again before its end (a module called twice)
  u.running = true;
  u.running_backward = backward;
  if (planned_) let_go_of_passed(unit, backward);
  if (in_place_ && !u.resident) return;  // read where it lives
  if (u.staged) {
    u.staged = false;  // its holds pass to this run
    staged_.erase(std::find(staged_.begin(), staged_.end(), unit));
  } else {
    TraceScope scope("bring", u.name, [&] { return unit_bytes(unit); }, stream_ref(bring_stream_));
    bring_entries(u.tensors, bring_stream_);
  }
  u.held = true;
  wait_ready(u.tensors);
  note_use(u.tensors);
  // (a forward recomputed inside a backward, activation checkpointing, runs
  // units the backward already passed: nothing to bring ahead of it)
  if (planned_ && (backward || !in_backward_)) stage_next(unit, backward);
  // Room for its gradients may let go of this unit too: its weights then
  // leave only if nothing else can, and its backward reads them where they
  // are. Kept held, the host would wait for copies home at every unit
  // (GPT-2 1.2B under 4 GiB, H100, 2026-11-25: 0.67 s a step against 0.48).
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
  // not stop the link ahead of a large one.
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
    if (ahead > 0 && ahead + v.stream_bytes > cap) break;
    ahead += v.stream_bytes;
    if (v.staged || v.running) continue;
    TraceScope scope("bring", v.name, [&] { return unit_bytes(next); },
                     stream_ref(bring_stream_));
    // brought ahead only where the arena has room (it comes on demand)
    if (!bring_entries(v.tensors, bring_stream_, /*optional=*/true)) break;
    v.staged = true;
    v.staged_backward = backward;
    v.staged_from = at;
    staged_.push_back(next);
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
      u.grad_ids[u.trainable[k].unsafeGetTensorImpl()] = gid;
      reap_homes();
      carry_out(budget_.admit(device_.index(), key(gid), g.nbytes(), true, share_, false));
    } else {
      Entry& e = entries_[gid];
      if (e.tensor->has_target()) by_target_.erase(e.tensor->target().unsafeGetTensorImpl());
      if (e.tensor->in_slot()) {  // the last step's, still on the GPU: it died
        budget_.discard(key(gid));
        abandon(gid);
      }
      e.tensor->retarget(g);
      by_target_[g.unsafeGetTensorImpl()] = gid;
      adopt(gid);
    }
    fresh.push_back(gid);
  }
  note_use(fresh);  // made by the backward on this stream
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
    abandon(gid);
  }
}

void StreamExecutor::step_begins() { step_inputs_.record(stream_ref(compute())); }

std::string StreamExecutor::owner_of(const std::vector<at::Tensor>& tensors) const {
  for (const at::Tensor& t : tensors) {
    if (const int id = entry_for(t); id >= 0) return entries_[id].name;
  }
  return "optimizer";
}

void StreamExecutor::bring(const std::vector<at::Tensor>& tensors, std::size_t new_bytes) {
  std::vector<int> ids;
  for (const at::Tensor& t : tensors) {
    int id = entry_for(t);
    // a home it did not make: an optimizer state load_state_dict put there
    if (id < 0 && streamable(t) && is_pinned_home(t.storage().data_ptr())) {
      id = add_entry(t, StreamedTensor::Memory::kHome, owner_of(tensors) + ".state");
    }
    if (id >= 0 && entries_[id].tensor->has_target()) ids.push_back(id);
  }
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
  note_use(ids);  // a step may run on a stream of its own (step_in_backward)
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
  const std::string owner = owner_of(tensors);  // new states are named by the step's first weight
  for (const at::Tensor& t : tensors) {
    int id = entry_for(t);
    if (id < 0) {  // made by the step (an optimizer state): on the GPU now
      if (!streamable(t)) continue;
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
  note_use(ids);  // the states it made, on the step's stream
  std::vector<int> held;
  held.swap(step_held_);
  for (int id : held) release(id);
  evict_now(ids);
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

void StreamExecutor::evict_now(const std::vector<int>& ids) {
  record_done(ids);
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
  staged_.clear();
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
