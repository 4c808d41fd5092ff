// The CUDA allocator slot: a CUDAPluggableAllocator whose hooks call the
// CachingManagedAllocator. PyTorch allows swapping its CUDA allocator only
// before the first one is initialized, so install() checks that first and
// says how to fix the order if it is too late.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <map>
#include <mutex>

#include "torch/state.h"
#include "torch/slots.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

DeviceIndex stream_device(cudaStream_t stream) {
#if CUDART_VERSION >= 12080
  if (stream != nullptr) {
    int device = 0;
    if (cudaStreamGetDevice(stream, &device) == cudaSuccess) return device;
    (void)cudaGetLastError();
  }
#endif
  return c10::cuda::current_device();
}

// Streams being captured into CUDA graphs, by graph pool. An allocation there
// would be baked into the graph and its block reused between replays; PyTorch
// solves that with private pools, which torch_uvm does not have yet, so such an
// allocation is refused with a clear error instead of corrupting memory.
std::mutex g_capture_mutex;
std::map<c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>> g_capture_filters;

void refuse_allocation_during_capture(cudaStream_t stream) {
  if (!capture_underway()) return;
  std::lock_guard<std::mutex> lock(g_capture_mutex);
  for (const auto& [pool, filter] : g_capture_filters) {
    TORCH_CHECK(!filter(stream),
                "torch_uvm: a tensor was allocated while a CUDA graph was being captured. "
                "Managed memory has no private graph pools yet, so this is refused rather "
                "than risking memory reuse between replays. Allocate the tensors the graph "
                "uses before capture (static inputs and outputs), or capture with UVM off.");
  }
}

}  // namespace

void install_cuda_slot() {
  auto current = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(current == nullptr || !current->initialized(),
              "torch_uvm: PyTorch's CUDA allocator is already initialized (a CUDA "
              "tensor was created, or torch.cuda was initialized), so it can no "
              "longer be replaced. Enable UVM first: call "
              "torch_uvm.set_enabled_uvm(True) at the top of the program, or set "
              "PYTORCH_ENABLE_UNIFIED_MEMORY=1 before it starts.");
  CachingManagedAllocator& a = allocator();
  auto custom = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
      [&a](size_t size, int device, cudaStream_t stream) -> void* {
        refuse_allocation_during_capture(stream);
        return translate_errors([&] {
          return a.allocate(size, device,
                            {device, reinterpret_cast<std::uintptr_t>(stream)});
        });
      },
      [&a](void* ptr, size_t, int, cudaStream_t) {
        try {
          a.free(ptr);
        } catch (const std::exception& e) {
          TORCH_WARN("torch_uvm: ", e.what());
        }
      });
  auto* pluggable =
      static_cast<torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator*>(custom.get());
  pluggable->set_init_fn([](int) {});
  pluggable->set_reset_fn([&a] { translate_errors([&] { a.empty_cache(); }); });
  pluggable->set_record_stream_fn([&a](void* ptr, cudaStream_t stream) {
    translate_errors([&] {
      a.record_stream(ptr, {stream_device(stream), reinterpret_cast<std::uintptr_t>(stream)});
    });
  });
  pluggable->set_memory_fraction_fn([&a](double fraction, int device) {
    TORCH_CHECK_VALUE(fraction > 0 && fraction <= 1,
                      "torch_uvm: memory fraction must be in (0, 1], got ", fraction);
    std::size_t free_bytes = 0, total = 0;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    translate_errors([&] { a.set_cap(static_cast<std::size_t>(fraction * total)); });
  });
  pluggable->set_begin_allocate_to_pool(
      [](int, c10::cuda::MempoolId_t pool, std::function<bool(cudaStream_t)> filter) {
        {
          std::lock_guard<std::mutex> lock(g_capture_mutex);
          g_capture_filters[pool] = std::move(filter);
        }
        note_capture_begin();
      });
  pluggable->set_end_allocate_to_pool_fn([](int, c10::cuda::MempoolId_t pool) {
    {
      std::lock_guard<std::mutex> lock(g_capture_mutex);
      g_capture_filters.erase(pool);
    }
    note_capture_end();
  });
  pluggable->set_release_pool([](int, c10::cuda::MempoolId_t) {});
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(custom);
}

}  // namespace torch_uvm
