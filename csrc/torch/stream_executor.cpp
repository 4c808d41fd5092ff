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
      schedule_(budget, share, ahead, in_place, training),
      bring_stream_(c10::cuda::getStreamFromPool(false, device.index())),
      home_stream_(c10::cuda::getStreamFromPool(false, device.index())),
      homes_(allocator().runtime(), budget, share,
             [](std::size_t bytes) {
               return std::make_shared<TraceScope>("wait_for_home", "", bytes);
             }),
      steps_behind_(allocator().runtime(),
                    [] { return std::make_shared<TraceScope>("wait_for_step", "", 0); }),
      compute_done_(allocator().runtime()),
      step_inputs_(allocator().runtime()) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "torch_uvm: streaming needs a GPU");
  TORCH_CHECK(budget.device_of(share) == device.index(), "torch_uvm: internal error: residency "
              "share ", share, " is not on ", device, "; please report it");
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
  return schedule_.add_unit(storage_bytes(trainable));
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
  for (int unit = 0; unit < units(); ++unit) {
    if (schedule_.resident(unit)) {
      resident += unit_bytes(unit);
      continue;
    }
    const char* why = schedule_.holds(unit);
    if (!why) continue;
    if (shown++ < 8) {
      os << (shown > 1 ? ", " : "") << "'" << units_[unit].name << "' (" << why << ", "
         << format_bytes(unit_bytes(unit)) << ")";
    }
  }
  if (shown > 8) os << " and " << shown - 8 << " more";
  if (shown == 0) os << "no streamed unit";
  os << "; resident units: " << format_bytes(resident);
  if (!step_held_.empty()) os << "; an optimizer step's tensors";
  return os.str();
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
                       schedule_.training() ? ResidentAt::kStart : ResidentAt::kEnd);
}

std::size_t StreamExecutor::streamed_per_pass(std::size_t per_streamed,
                                              std::size_t per_any) const {
  const ResidentPlan p = plan_for(schedule_.pass_order(), per_streamed, per_any);
  std::size_t sum = 0;
  for (std::size_t b : p.stream_bytes) sum += b;
  return sum;
}

void StreamExecutor::set_in_place(bool in_place) { schedule_.set_in_place(in_place); }

void StreamExecutor::plan(std::size_t per_streamed, std::size_t per_any) {
  TraceScope scope("plan", "", budget_.share_stats(share_).limit);
  // The first forward's slots leave, and the resident units come first into
  // the empty arena: in one piece at its start, with the ring after them.
  evict_unused();
  homes_.reap();
  const std::vector<int> order = schedule_.pass_order();
  const ResidentPlan planned = plan_for(order, per_streamed, per_any);
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (!planned.resident[i]) continue;
    bring_entries(units_[order[i]].tensors, bring_stream_);
    for (int id : units_[order[i]].tensors) {
      entries_[id].pinned = true;
      release(id);
    }
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (planned.resident[i]) wait_ready(units_[order[i]].tensors);
  }
  // (a tied weight held resident is not brought: the plan's stream bytes)
  schedule_.plan(order, planned.resident, planned.stream_bytes, planned.largest_streamed,
                 per_any);
}

}  // namespace torch_uvm
