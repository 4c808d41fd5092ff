#include "torch/slot_memory.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>

#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace cca = c10::cuda::CUDACachingAllocator;
namespace {

std::atomic<cca::CUDAAllocator*> g_native{nullptr};

// PyTorch's own caching allocator: the one saved when torch_uvm replaced
// it, else the current one (UVM off: PyTorch's own).
cca::CUDAAllocator* native() {
  cca::CUDAAllocator* a = g_native.load();
  if (a == nullptr) return cca::get();
  static std::once_flag once;  // replaced before PyTorch initialized it
  std::call_once(once, [a] {
    if (!a->initialized()) a->init(c10::cuda::device_count());
  });
  return a;
}

// A slot's memory: PyTorch's DataPtr, and the bytes reserved under the cap.
struct Slot {
  c10::DataPtr memory;
  std::size_t bytes;
};

void free_slot(void* ctx) {
  auto* slot = static_cast<Slot*>(ctx);
  const std::size_t bytes = slot->bytes;
  delete slot;  // PyTorch's allocator takes its memory back
  if (auto* a = allocator_if_created()) a->release_outside(bytes);
}

}  // namespace

void set_native_cuda_allocator(cca::CUDAAllocator* a) { g_native.store(a); }

c10::Storage allocate_slot(std::size_t bytes, c10::cuda::CUDAStream stream) {
  TORCH_CHECK_WITH(OutOfMemoryError, allocator().reserve_outside(bytes),
                   "torch_uvm: a streamed tensor's GPU slot of ", bytes, " bytes does not fit "
                   "under the managed memory cap (", allocator().cap(), " bytes) beside what "
                   "torch_uvm holds: lower the offload's budget, or free GPU memory");
  c10::DataPtr memory;
  try {
    c10::cuda::CUDAStreamGuard guard(stream);  // the slot belongs to `stream`'s pool
    memory = native()->allocate(bytes);
  } catch (...) {
    allocator().release_outside(bytes);
    throw;
  }
  void* data = memory.get();
  auto* slot = new Slot{std::move(memory), bytes};
  c10::DataPtr owned(data, slot, &free_slot, c10::Device(c10::kCUDA, stream.device_index()));
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(owned),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

void record_slot_stream(const c10::Storage& memory, c10::cuda::CUDAStream stream) {
  const c10::DataPtr& p = memory.data_ptr();
  if (p.get() == nullptr) return;
  if (p.get_deleter() == &free_slot) {
    native()->recordStream(static_cast<Slot*>(p.get_context())->memory, stream);
  } else {
    cca::recordStream(p, stream);
  }
}

void release_cached_slots() {
  if (g_native.load() != nullptr) native()->emptyCache();
}

SlotMemoryStats slot_memory_stats(c10::DeviceIndex device) {
  const auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const auto s = native()->getDeviceStats(device);
  return {static_cast<std::size_t>(s.allocated_bytes[all].current),
          static_cast<std::size_t>(s.allocated_bytes[all].peak),
          static_cast<std::size_t>(s.reserved_bytes[all].current),
          static_cast<std::size_t>(s.reserved_bytes[all].peak)};
}

void reset_slot_memory_peak(c10::DeviceIndex device) { native()->resetPeakStats(device); }

}  // namespace torch_uvm
