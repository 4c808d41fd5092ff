// CudaAllocator: allocation, free, streams, memory fraction, cache info,
// peer access and the refusal of CUDA IPC (cuda_allocator.h).
#include "torch/cuda_allocator.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "core/errors.h"
#include "torch/prefetch_advise.h"
#include "torch/state.h"
#include "torch/slot_memory.h"
#include "torch/streamed_tensor.h"

namespace torch_uvm {
namespace {

std::atomic<CudaAllocator*> g_instance{nullptr};

StreamRef stream_ref(c10::DeviceIndex device, cudaStream_t stream) {
  return {device, reinterpret_cast<std::uintptr_t>(stream)};
}

}  // namespace

CudaAllocator::CudaAllocator(CachingManagedAllocator& core)
    : core_(core), history_(core.runtime().device_count()) {
  core_.set_observer([this](const AllocatorEvent& e) {
    if (history_.observing()) history_.on_event(e);
  });
}

CudaAllocator* CudaAllocator::instance() { return g_instance.load(); }
void CudaAllocator::set_instance(CudaAllocator* a) { g_instance.store(a); }

void CudaAllocator::init(int) { initialized_ = true; }

void* CudaAllocator::allocate_on(c10::DeviceIndex device, cudaStream_t stream, size_t bytes) {
  if (bytes == 0) return nullptr;
  // Stacks are gathered before the allocator's lock (memory_history.h).
  if (history_.enabled()) MemoryHistory::stage(history_.gather_for_alloc());
  try {
    void* p = core_.allocate(bytes, device, stream_ref(device, stream));
    MemoryHistory::stage(nullptr);
    // prefetch_on_alloc, RMM's prefetch adaptor: the pages are on the GPU
    // before the first kernel touches them (never inside a graph capture).
    if (core_.policy().config().prefetch_on_alloc &&
        c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None) {
      schedule_prefetch(p, bytes, device, stream_ref(device, stream), /*off_thread=*/false);
    }
    return p;
  } catch (const OutOfMemoryError&) {
    MemoryHistory::stage(nullptr);
    try {
      report_oom(device);
    } catch (...) {
      rethrow_as_c10();
    }
  } catch (...) {
    MemoryHistory::stage(nullptr);
    rethrow_as_c10();
  }
}

c10::DataPtr CudaAllocator::allocate(size_t bytes) {
  c10::DeviceIndex device = c10::cuda::current_device();
  void* p = allocate_on(device, c10::cuda::getCurrentCUDAStream(device).stream(), bytes);
  // CUDA graph trees require {ptr, ptr, raw_deleter(), device}.
  return {p, p, &free_ptr, c10::Device(c10::kCUDA, device)};
}

void* CudaAllocator::raw_alloc(size_t bytes) {
  c10::DeviceIndex device = c10::cuda::current_device();
  return allocate_on(device, c10::cuda::getCurrentCUDAStream(device).stream(), bytes);
}

void* CudaAllocator::raw_alloc_with_stream(size_t bytes, cudaStream_t stream) {
  c10::DeviceIndex current = c10::cuda::current_device();
  auto device = static_cast<c10::DeviceIndex>(
      core_.runtime().stream_device(reinterpret_cast<std::uintptr_t>(stream), current));
  return allocate_on(device, stream, bytes);
}

void CudaAllocator::free_ptr(void* ptr) {
  if (ptr == nullptr || in_forked_child()) return;  // after fork the parent owns it
  CudaAllocator* self = instance();
  if (self == nullptr) return;
  if (self->history_.enabled()) MemoryHistory::stage(self->history_.gather_for_free());
  try {
    self->core_.free(ptr);
  } catch (const std::exception& e) {
    // A deleter must not throw; report the bug instead of losing it.
    TORCH_WARN("torch_uvm: ", e.what());
  }
  MemoryHistory::stage(nullptr);
}

void CudaAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  c10::DeviceIndex device = c10::cuda::current_device();
  translate_errors([&] {
    core_.runtime().copy(dest, src, count,
                         stream_ref(device, c10::cuda::getCurrentCUDAStream(device).stream()),
                         /*synchronous=*/true, CopyKind::kAny);
  });
}

void CudaAllocator::emptyCache(c10::MempoolId_t) {
  // Every released pool's free segments go too; a live pool's never do.
  translate_errors([&] { core_.empty_cache(); });
  // streamed tensors' slots, cached by PyTorch's own allocator (not while
  // this thread captures a graph: that allocator waits on its events)
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None) {
    release_cached_slots();
  }
}

void CudaAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (ptr.get() == nullptr) return;
  if (record_stream_of_streamed(ptr, stream)) return;  // a slot or a home: not ours
  // The stream knows its device: no guess from the current one.
  translate_errors([&] { core_.record_stream(ptr.get(), stream_ref(stream.device_index(), stream.stream())); });
}

double CudaAllocator::getMemoryFraction(c10::DeviceIndex device) {
  return core_.memory_fraction(device);
}

void CudaAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  translate_errors([&] { core_.set_memory_fraction(device, fraction); });
}

void CudaAllocator::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  // cuDNN's benchmark mode sizes its workspace with this: the largest
  // request that can succeed without waiting. That is the larger of the
  // biggest cached block and the room left under the cap, and (as PyTorch's
  // first guess) no more than the GPU has free.
  translate_errors([&] {
    const std::size_t cap = core_.cap();
    const auto reserved = static_cast<std::size_t>(core_.stats().reserved_bytes.all().current);
    std::size_t room = cap > reserved ? cap - reserved : 0;
    if (*largest_block == 0) {
      *largest_block = std::min(room, core_.runtime().memory_info(device).free_bytes);
    }
    *largest_block = std::max(*largest_block, core_.largest_free_block(device));
  });
}

void* CudaAllocator::getBaseAllocation(void* ptr, size_t* size) {
  auto [base, bytes] = core_.segment_of(ptr);
  TORCH_CHECK(base != nullptr, "torch_uvm: getBaseAllocation: ", ptr,
              " is not memory of torch_uvm's allocator");
  if (size != nullptr) *size = bytes;
  return base;
}

cca::ShareableHandle CudaAllocator::shareIpcHandle(void*) {
  TORCH_CHECK(false,
              "torch_uvm: a CUDA tensor in managed memory cannot be shared with another "
              "process: CUDA IPC does not support managed (cudaMallocManaged) memory. "
              "Share a CPU tensor instead (torch.multiprocessing moves it to shared "
              "memory; the receiver calls .to('cuda')), or run the producer with UVM off.");
}

std::shared_ptr<void> CudaAllocator::getIpcDevPtr(std::string) {
  TORCH_CHECK(false,
              "torch_uvm: cannot open a CUDA IPC handle with UVM on: this process's CUDA "
              "allocator is torch_uvm's managed memory, which CUDA IPC does not support. "
              "Send CPU tensors between processes, or run this process with UVM off.");
}

void CudaAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  translate_errors([&] { core_.runtime().enable_peer_access(dev, dev_to_access); });
}

cudaError_t CudaAllocator::memcpyAsync(void* dst, int dst_device, const void* src,
                                       int src_device, size_t count, cudaStream_t stream, bool) {
  // Managed memory is one address space: a plain copy works between any two
  // devices, with or without peer access. PyTorch asks this for copies
  // between GPU tensors; on one GPU, between two ranges of this allocator,
  // the driver is told it is device to device (CopyKind). A CUDA tensor
  // over other memory (pinned host memory through DLPack) keeps kAny.
  translate_errors([&] {
    auto device = static_cast<DeviceIndex>(
        core_.runtime().stream_device(reinterpret_cast<std::uintptr_t>(stream), src_device));
    const bool ours = dst_device == src_device && core_.segment_of(dst).first != nullptr &&
                      core_.segment_of(src).first != nullptr;
    core_.runtime().copy(dst, src, count, {device, reinterpret_cast<std::uintptr_t>(stream)},
                         /*synchronous=*/false, ours ? CopyKind::kDeviceToDevice : CopyKind::kAny);
  });
  return cudaSuccess;
}

}  // namespace torch_uvm
