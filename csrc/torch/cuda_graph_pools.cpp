// Private pools for CUDA graphs, torch.cuda.MemPool and torch.compile's
// CUDA graph trees: the CUDAAllocator hooks over the policy's pools
// (core/graph_pools.cpp, core/pool_checkpoint.cpp).
//
// While a pool is being allocated to, the glue also counts a capture
// (state.h): CPU tensors then come from ordinary memory and moves skip their
// prefetch, since neither a new managed segment for the CPU nor a prefetch
// may be captured. The pool's own segments are made in relaxed capture mode
// (runtime/gpu_runtime.cpp).
#include "torch/cuda_allocator.h"
#include "torch/state.h"

namespace torch_uvm {
namespace {

PoolId to_pool(c10::MempoolId_t id) { return {id.first, id.second}; }

// What getCheckpointState hands PyTorch and setCheckpointPoolState takes back.
struct UvmPoolState final : cca::AllocatorState {
  UvmPoolState(c10::DeviceIndex d, PoolCheckpoint c) : device(d), checkpoint(std::move(c)) {}
  c10::DeviceIndex device;
  PoolCheckpoint checkpoint;
};

}  // namespace

void CudaAllocator::beginAllocateToPool(c10::DeviceIndex, c10::MempoolId_t mempool_id,
                                        std::function<bool(cudaStream_t)> filter) {
  translate_errors([&] {
    core_.begin_allocate_to_pool(to_pool(mempool_id), [filter](StreamRef s) {
      return filter(reinterpret_cast<cudaStream_t>(s.handle));
    });
  });
  note_capture_begin();
}

void CudaAllocator::endAllocateToPool(c10::DeviceIndex, c10::MempoolId_t mempool_id) {
  translate_errors([&] { core_.end_allocate_to_pool(to_pool(mempool_id)); });
  note_capture_end();
}

void CudaAllocator::releasePool(c10::DeviceIndex, c10::MempoolId_t mempool_id) {
  // PyTorch calls this from CUDAGraph's and MemPool's destructors, where an
  // exception would end the process: a release without a use is reported.
  try {
    core_.release_pool(to_pool(mempool_id));
  } catch (const std::exception& e) {
    TORCH_WARN("torch_uvm: ", e.what());
  }
}

int CudaAllocator::getPoolUseCount(c10::DeviceIndex, c10::MempoolId_t mempool_id) {
  return core_.pool_use_count(to_pool(mempool_id));
}

void CudaAllocator::createOrIncrefPool(c10::DeviceIndex, c10::MempoolId_t mempool_id,
                                       std::shared_ptr<cca::CUDAAllocator> allocator) {
  TORCH_CHECK_VALUE(allocator == nullptr || allocator.get() == this,
                    "torch_uvm: a torch.cuda.MemPool with its own allocator cannot be used "
                    "with UVM on: every CUDA allocation comes from torch_uvm's managed "
                    "memory. Create the MemPool without an allocator.");
  translate_errors([&] { core_.create_or_incref_pool(to_pool(mempool_id)); });
}

void CudaAllocator::setUseOnOOM(c10::DeviceIndex, c10::MempoolId_t, bool use_on_oom) {
  // MemPool's destructor calls this with false: that must always work.
  TORCH_CHECK_NOT_IMPLEMENTED(!use_on_oom,
                              "torch_uvm: torch.cuda.MemPool(use_on_oom=True) is not supported: "
                              "torch_uvm does not take blocks from a private pool when the "
                              "ordinary cache runs out. Create the MemPool without use_on_oom.");
}

void CudaAllocator::setNoSplit(c10::DeviceIndex, c10::MempoolId_t) {
  // Splitting only decides how a pool's segments are carved; a pool whose
  // blocks are split serves the same requests. Accepted, and ignored.
}

bool CudaAllocator::checkPoolLiveAllocations(c10::DeviceIndex, c10::MempoolId_t mempool_id,
                                             const std::unordered_set<void*>& expected) {
  std::unordered_set<const void*> wanted(expected.begin(), expected.end());
  return translate_errors([&] { return core_.pool_allocations_are(to_pool(mempool_id), wanted); });
}

std::shared_ptr<cca::AllocatorState> CudaAllocator::getCheckpointState(c10::DeviceIndex device,
                                                                       c10::MempoolId_t id) {
  return translate_errors([&] {
    return std::make_shared<UvmPoolState>(device, core_.checkpoint_pool(to_pool(id)));
  });
}

cca::CheckpointDelta CudaAllocator::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) {
  auto* pool_state = dynamic_cast<UvmPoolState*>(state.get());
  TORCH_CHECK_VALUE(pool_state != nullptr,
                    "torch_uvm: setCheckpointPoolState was given a state that "
                    "torch_uvm's getCheckpointState did not make");
  PoolRestore restored = translate_errors([&] { return core_.restore_pool(pool_state->checkpoint); });
  cca::CheckpointDelta delta;
  delta.ptrs_freed = std::move(restored.freed);
  for (const AllocationInfo& a : restored.allocated) {
    delta.dataptrs_allocd.emplace_back(a.base, a.base, &free_ptr, c10::Device(c10::kCUDA, device));
  }
  return delta;
}

}  // namespace torch_uvm
