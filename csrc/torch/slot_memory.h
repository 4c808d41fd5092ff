// Where a streamed tensor's slot comes from: GPU device memory, not managed,
// from PyTorch's own caching allocator, whichever allocator PyTorch uses for
// other tensors (torch_uvm's, with UVM on). Copy engines move pinned homes
// to and from device memory at 86 GB/s both ways at once, beside kernels;
// with managed memory on either side, at 51 together, and kernels wait
// (benchmarks/results/2026-11-23-h100/mechanisms-uvm-*.log).
//
// Slot bytes count against torch_uvm's managed memory cap
// (CachingManagedAllocator::reserve_outside): slots and the managed pool
// together never exceed it.
#pragma once

#include <c10/core/Storage.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace torch_uvm {

// One share's slots in one range of device memory (core/slot_arena.h),
// itself drawn from PyTorch's own allocator as one slot.
class SlotArenaMemory;
// Throws c10::OutOfMemoryError as allocate_slot does.
std::shared_ptr<SlotArenaMemory> make_slot_arena(std::size_t bytes, c10::cuda::CUDAStream stream);
// Slots of `bytes` each from `arena`, for its stream, all or none (empty);
// `wait`: for its pending frees if they leave no room (SlotArena::allocate_all).
std::vector<c10::Storage> allocate_arena_slots(const std::vector<std::size_t>& bytes,
                                               SlotArenaMemory& arena, bool wait = true);
// Slots of `bytes` each from PyTorch's own allocator for `arena`'s stream,
// beside the arena that had no room for them (counted: arena_misses).
std::vector<c10::Storage> allocate_slots_beside(const std::vector<std::size_t>& bytes,
                                                SlotArenaMemory& arena);
bool is_arena_slot(const c10::Storage& memory);

// install_cuda_slot saves PyTorch's own allocator here before replacing it.
void set_native_cuda_allocator(c10::cuda::CUDACachingAllocator::CUDAAllocator* native);

// `bytes` of device memory on `stream`'s device, for `stream`'s use first,
// from PyTorch's own allocator.
// Throws c10::OutOfMemoryError if they do not fit under the cap or on the GPU.
c10::Storage allocate_slot(std::size_t bytes, c10::cuda::CUDAStream stream);

// The memory is not reused before `stream` passes this point (a slot's:
// PyTorch's allocator; any other CUDA memory: the current allocator's).
void record_slot_stream(const c10::Storage& memory, c10::cuda::CUDAStream stream);

// The slots' freed memory cached by PyTorch's own allocator goes back to the
// GPU, when that allocator holds nothing else (UVM on).
void release_cached_slots();

// What PyTorch's own allocator holds on `device`, now and at its peak: with
// UVM on, the slots alone (the GPU memory that streaming really uses, beside
// the budget's books); with UVM off, every CUDA tensor's too.
struct SlotMemoryStats {
  std::size_t allocated = 0, allocated_peak = 0;
  std::size_t reserved = 0, reserved_peak = 0;
  // The shares' arenas (counted in the figures above as allocated): their
  // bytes now, and all time, the slots that found no room in one (drawn
  // from PyTorch's allocator beside it) and those that waited for a
  // stream to pass a free.
  std::size_t arena_bytes = 0, arena_misses = 0, arena_waits = 0;
};
SlotMemoryStats slot_memory_stats(c10::DeviceIndex device);
void reset_slot_memory_peak(c10::DeviceIndex device);

}  // namespace torch_uvm
