// PyTorch's CUDA allocator, in full, over the CachingManagedAllocator.
//
// Why a direct subclass of CUDAAllocator rather than CUDAPluggableAllocator:
// the pluggable allocator keeps its own map of every live pointer (a second
// lock and a hash insert per allocation) and routes its deleter through a
// global lookup, and the methods it leaves unimplemented are most of what is
// asked here. A direct subclass is one virtual call over the policy. The
// cost is that a new pure virtual in a later torch fails to compile; CI
// builds against torch 2.14 and the GPU machines against 2.11, which keeps
// that visible (docs/design.md).
//
// This file declares the class; its methods live by concern:
//   cuda_allocator.cpp     allocation, free, streams, fraction, IPC refusal
//   cuda_stats.cpp         torch.cuda.memory_stats and friends
//   memory_history.cpp     _record_memory_history, snapshots, OOM observers
//   cuda_graph_pools.cpp   private pools and checkpoints for CUDA graphs
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/headeronly/version.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/caching_managed_allocator.h"
#include "torch/memory_history.h"

#define TORCH_UVM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace torch_uvm {

namespace cca = c10::cuda::CUDACachingAllocator;

class CudaAllocator final : public cca::CUDAAllocator {
 public:
  explicit CudaAllocator(CachingManagedAllocator& core);

  // The installed instance (null before install_cuda_slot).
  static CudaAllocator* instance();
  static void set_instance(CudaAllocator* a);

  // ---- c10::Allocator ----
  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &free_ptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // ---- c10::DeviceAllocator ----
  bool initialized() override { return initialized_.load(); }
  void emptyCache(c10::MempoolId_t mempool_id) override;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;

  // ---- CUDAAllocator: memory ----
  void* raw_alloc(size_t bytes) override;
  void* raw_alloc_with_stream(size_t bytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override { free_ptr(ptr); }
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};  // managed segments are never expandable
  }
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override;
  std::string name() override { return "torch_uvm"; }

  // ---- CUDAAllocator: history and snapshots (memory_history.cpp) ----
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
  bool isHistoryEnabled() override { return history_.enabled(); }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override;
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override;
#if TORCH_UVM_TORCH_AT_LEAST(2, 14)
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override;
#endif

  // ---- CUDAAllocator: private pools (cuda_graph_pools.cpp) ----
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                   bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) override;

  CachingManagedAllocator& core() { return core_; }
  MemoryHistory& history() { return history_; }

 private:
  // The deleter of every DataPtr this allocator makes (raw_deleter()).
  static void free_ptr(void* ptr);
  void* allocate_on(c10::DeviceIndex device, cudaStream_t stream, size_t bytes);
  [[noreturn]] void report_oom(c10::DeviceIndex device);

  CachingManagedAllocator& core_;
  MemoryHistory history_;
  std::atomic<bool> initialized_{false};
  bool enabled_ = true;
  std::mutex observers_mutex_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
};

}  // namespace torch_uvm
