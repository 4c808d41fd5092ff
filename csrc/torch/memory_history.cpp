#include "torch/memory_history.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include "torch/cuda_allocator.h"
#include "torch/state.h"

namespace torch_uvm {
namespace {

using c10::CachingDeviceAllocator::RecordContext;
using Action = MemoryHistory::TraceEntry::Action;

thread_local MemoryHistory::Context t_staged;

Action action_of(AllocatorEvent::Kind kind) {
  switch (kind) {
    case AllocatorEvent::kAlloc: return Action::ALLOC;
    case AllocatorEvent::kFreeRequested: return Action::FREE_REQUESTED;
    case AllocatorEvent::kFreeCompleted: return Action::FREE_COMPLETED;
    case AllocatorEvent::kSegmentAlloc: return Action::SEGMENT_ALLOC;
    case AllocatorEvent::kSegmentFree: return Action::SEGMENT_FREE;
    case AllocatorEvent::kOom: return Action::OOM;
  }
  return Action::OOM;
}

}  // namespace

// ---- MemoryHistory ----------------------------------------------------------

void MemoryHistory::record(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder,
                           std::size_t max_entries, RecordContext when, bool clear,
                           const std::vector<std::string>& skip_actions) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : RecordContext::NEVER;
  max_entries_ = enabled ? max_entries : 0;
  skip_.clear();
  for (const auto& name : skip_actions) {
    skip_.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(name));
  }
  if (clear || !enabled) {
    for (auto& t : traces_) t.clear();
  }
  if (!enabled) live_contexts_.clear();
  enabled_ = enabled;
  observing_ = enabled || !trackers_.empty();
}

MemoryHistory::Context MemoryHistory::gather_for_alloc() {
  if (!enabled()) return nullptr;
  c10::CachingDeviceAllocator::CreateContextFn recorder;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (when_ == RecordContext::NEVER || recorder_ == nullptr) return nullptr;
    recorder = recorder_;
  }
  return recorder();
}

MemoryHistory::Context MemoryHistory::gather_for_free() {
  if (!enabled()) return nullptr;
  c10::CachingDeviceAllocator::CreateContextFn recorder;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (when_ != RecordContext::ALL || recorder_ == nullptr) return nullptr;
    recorder = recorder_;
  }
  return recorder();
}

void MemoryHistory::stage(Context context) { t_staged = std::move(context); }

void MemoryHistory::on_event(const AllocatorEvent& event) {
  // CPU-home memory is not in any GPU's trace: torch.cuda's history is about
  // GPUs. torch_uvm.memory_snapshot() shows it.
  if (event.home < 0 || static_cast<std::size_t>(event.home) >= traces_.size()) return;
  Context context = t_staged;
  if (event.kind == AllocatorEvent::kAlloc || event.kind == AllocatorEvent::kFreeRequested ||
      event.kind == AllocatorEvent::kOom) {
    t_staged = nullptr;  // one stack, one user call
  }
  std::size_t addr = reinterpret_cast<std::size_t>(event.ptr);
  if (event.kind == AllocatorEvent::kOom) {
    addr = 0;  // PyTorch puts the device's free bytes here; managed memory has no such figure
  }
  TraceEntry entry(action_of(event.kind), static_cast<c10::DeviceIndex>(event.home), addr,
                   event.size, reinterpret_cast<void*>(event.stream.handle),
                   c10::MempoolId_t{event.pool.first, event.pool.second},
                   c10::getApproximateTime());
  entry.time_.t_ = c10::getTime();  // snapshots report wall time
  std::lock_guard<std::mutex> lock(mutex_);
  if (enabled_) {
    if (event.kind == AllocatorEvent::kAlloc && when_ != RecordContext::NEVER) {
      live_contexts_[event.ptr] = context;
    } else if (event.kind == AllocatorEvent::kFreeRequested) {
      live_contexts_.erase(event.ptr);
    }
    // STATE keeps stacks only for live blocks, not in the trace.
    if (when_ == RecordContext::ALL ||
        (when_ == RecordContext::ALLOC && event.kind != AllocatorEvent::kFreeRequested &&
         event.kind != AllocatorEvent::kFreeCompleted)) {
      entry.context_ = context;
    }
  }
  for (const auto& tracker : trackers_) tracker(entry);
  if (enabled_ && !skip_.count(entry.action_)) append(std::move(entry));
}

void MemoryHistory::append(TraceEntry entry) {
  auto& trace = traces_[static_cast<std::size_t>(entry.device_)];
  if (max_entries_ == 0) return;
  if (trace.size() >= max_entries_) trace.pop_front();
  trace.push_back(std::move(entry));
}

void MemoryHistory::add_tracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker) {
  std::lock_guard<std::mutex> lock(mutex_);
  trackers_.push_back(std::move(tracker));
  observing_ = true;
}

MemoryHistory::Context MemoryHistory::context_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_contexts_.find(ptr);
  return it == live_contexts_.end() ? nullptr : it->second;
}

std::vector<std::vector<MemoryHistory::TraceEntry>> MemoryHistory::traces() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<TraceEntry>> out;
  for (const auto& t : traces_) out.emplace_back(t.begin(), t.end());
  return out;
}

// ---- CudaAllocator: history, snapshots, observers ---------------------------

void CudaAllocator::recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                                  size_t alloc_trace_max_entries, cca::RecordContext when,
                                  bool clear_history,
                                  const std::vector<std::string>& skip_actions) {
  history_.record(enabled, context_recorder, alloc_trace_max_entries, when, clear_history,
                  skip_actions);
}

void CudaAllocator::attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) {
  history_.add_tracker(std::move(tracker));
}

void CudaAllocator::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

#if TORCH_UVM_TORCH_AT_LEAST(2, 14)
void CudaAllocator::attachOomRejectionObserver(cca::OomRejectionObserver) {
  // PyTorch calls these when its throw_on_cudamalloc_oom policy rejects a
  // request up front; torch_uvm has no such policy, so none is ever called.
}
#endif

void CudaAllocator::report_oom(c10::DeviceIndex device) {
  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    observers = oom_observers_;
  }
  if (!observers.empty()) {
    const auto stats = core_.stats(device);
    const std::size_t cap = core_.cap();
    const auto reserved = static_cast<std::size_t>(core_.stats().reserved_bytes.all().current);
    for (const auto& observer : observers) {
      // "Device" total and free, as torch_uvm sees them: the cap and what
      // is left under it.
      observer(device, static_cast<std::size_t>(stats.allocated_bytes.all().current), cap,
               cap > reserved ? cap - reserved : 0);
    }
  }
  throw;  // the OutOfMemoryError being handled
}

cca::SnapshotInfo CudaAllocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  cca::SnapshotInfo info;
  const PoolId wanted{mempool_id.first, mempool_id.second};
  for (const SegmentSnapshot& s : core_.snapshot()) {
    if (s.home < 0) continue;  // CPU-home segments: torch_uvm.memory_snapshot()
    if (wanted != kDefaultPool && s.pool != wanted) continue;
    c10::CachingDeviceAllocator::SegmentInfo seg;
    seg.device = static_cast<c10::DeviceIndex>(s.home);
    seg.address = s.address;
    seg.total_size = s.total_size;
    seg.requested_size = s.requested_size;
    seg.allocated_size = s.allocated_size;
    seg.active_size = s.active_size;
    seg.stream = reinterpret_cast<void*>(s.stream.handle);
    seg.is_large = s.segment_type == "large";
    seg.is_expandable = false;
    seg.owner_private_pool_id = {s.pool.first, s.pool.second};
    for (const BlockSnapshot& b : s.blocks) {
      c10::CachingDeviceAllocator::BlockInfo block;
      block.size = b.size;
      block.requested_size = b.requested_size;
      block.allocated = b.state == "active_allocated";
      block.active = b.state != "inactive";
      if (block.allocated) {
        block.context_when_allocated =
            history_.context_of(reinterpret_cast<const void*>(b.address));
      }
      seg.blocks.push_back(std::move(block));
    }
    if (!seg.blocks.empty()) seg.context_when_allocated = seg.blocks.front().context_when_allocated;
    info.segments.push_back(std::move(seg));
  }
  if (include_traces) info.device_traces = history_.traces();
  info.device_traces.resize(static_cast<std::size_t>(c10::cuda::device_count()));
  const AllocatorConfig& config = core_.policy().config();
  auto& meta = info.config_metadata;
  meta.garbage_collection_threshold = 0;
  meta.max_split_size = config.max_split_size;
  meta.pinned_num_register_threads = 0;
  meta.expandable_segments = false;
  meta.release_lock_on_malloc = false;
  meta.pinned_use_host_register = false;
  meta.graph_capture_record_stream_reuse = false;
  meta.last_allocator_settings = "torch_uvm (PYTORCH_UVM_ALLOC_CONF)";
  if (config.roundup_power2_divisions > 0) {
    meta.roundup_power2_divisions.assign(64, config.roundup_power2_divisions);
  }
#if TORCH_UVM_TORCH_AT_LEAST(2, 14)
  meta.max_round_threshold = 0;
  meta.max_cached_size = 0;
#endif
  return info;
}

}  // namespace torch_uvm
