// StreamExecutor (stream_executor.h): its books. The streamed tensors
// (entries) and the submodules (units), who holds what, the streams that
// used each slot, and the plan: which units stay resident and the order
// the others stream in. Its memory, a pass and training are in
// stream_executor_{memory,pass,training}.cpp.
#include "torch/stream_executor.h"

#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "core/errors.h"
#include "torch/state.h"
#include "torch/stream_ref.h"
#include "torch/trace_scope.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {

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
                             const std::vector<at::Tensor>& trainable,
                             const std::vector<at::Tensor>& buffers) {
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
  for (const at::Tensor& b : buffers) {
    const int id = entry_for(b);
    TORCH_CHECK(id >= 0, "torch_uvm: internal error: a buffer of submodule '", name,
                "' is not among its tensors; please report it");
    entries_[id].buffer = true;
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
  step_units_ = per_any;
  for (Unit& u : units_) {
    if (u.resident) wait_ready(u.tensors);
  }
  planned_ = true;
}

}  // namespace torch_uvm
