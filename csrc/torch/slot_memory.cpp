#include "torch/slot_memory.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "core/slot_arena.h"
#include "torch/state.h"
#include "torch/stream_ref.h"
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

constexpr int kMaxDevices = 64;
struct ArenaCounters {
  std::atomic<std::size_t> bytes{0}, misses{0}, waits{0};
};
ArenaCounters g_arenas[kMaxDevices];
ArenaCounters& counters(c10::DeviceIndex device) {
  return g_arenas[std::clamp<int>(device, 0, kMaxDevices - 1)];
}

}  // namespace

class SlotArenaMemory : public std::enable_shared_from_this<SlotArenaMemory> {
 public:
  SlotArenaMemory(std::size_t bytes, c10::cuda::CUDAStream stream)
      : memory_(allocate_slot(bytes, stream)),
        arena_(allocator().runtime(), memory_.mutable_data(), bytes, stream_ref(stream)),
        stream_(stream) {
    counters(device()).bytes += bytes;
  }
  // Its last slot is gone: the memory goes back to PyTorch's allocator,
  // reused there only once every stream that used a slot has passed (the
  // allocator records them, as it does a slot's: no wait here).
  ~SlotArenaMemory() {
    for (const auto& s : streams_) record_slot_stream(memory_, s);
    counters(device()).bytes -= memory_.nbytes();
  }
  SlotArena& arena() { return arena_; }
  c10::cuda::CUDAStream stream() const { return stream_; }
  c10::DeviceIndex device() const { return stream_.device_index(); }
  void record_stream(void* ptr, c10::cuda::CUDAStream s) {
    arena_.record_stream(ptr, stream_ref(s));
    std::lock_guard<std::mutex> lock(mutex_);
    if (s != stream_ && std::find(streams_.begin(), streams_.end(), s) == streams_.end()) {
      streams_.push_back(s);
    }
  }

 private:
  c10::Storage memory_;  // one slot of PyTorch's allocator
  SlotArena arena_;
  c10::cuda::CUDAStream stream_;
  std::mutex mutex_;
  std::vector<c10::cuda::CUDAStream> streams_;  // every other stream a slot was used on
};

namespace {

// Calls `f` on the arena, counting the waits it made for pending frees.
template <typename F>
auto counting_waits(SlotArenaMemory& arena, F f) {
  const std::size_t before = arena.arena().stats().waits;
  auto result = f(arena.arena());
  counters(arena.device()).waits += arena.arena().stats().waits - before;
  return result;
}

// A slot in an arena: the arena lives while any of its slots does.
struct ArenaSlot {
  std::shared_ptr<SlotArenaMemory> arena;
  void* ptr;
};

void free_arena_slot(void* ctx) {
  auto* slot = static_cast<ArenaSlot*>(ctx);
  try {
    slot->arena->arena().free(slot->ptr);
  } catch (...) {  // (a deleter must not throw; the arena knows every slot it gave)
  }
  delete slot;
}

}  // namespace

std::shared_ptr<SlotArenaMemory> make_slot_arena(std::size_t bytes,
                                                 c10::cuda::CUDAStream stream) {
  try {
    return std::make_shared<SlotArenaMemory>(bytes, stream);
  } catch (const c10::OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "torch_uvm: an offload streams its slots through "
                     "one range of GPU memory the size of its budget (", bytes, " bytes here), "
                     "which does not fit on cuda:", static_cast<int>(stream.device_index()),
                     " now: lower the offload's budget, or free GPU memory (",
                     e.what_without_backtrace(), ")");
  }
}

std::vector<c10::Storage> allocate_arena_slots(const std::vector<std::size_t>& bytes,
                                               SlotArenaMemory& arena, bool wait) {
  const std::vector<void*> placed =
      counting_waits(arena, [&](SlotArena& a) { return a.allocate_all(bytes, wait); });
  std::vector<c10::Storage> out;
  const c10::Device device(c10::kCUDA, arena.device());
  for (std::size_t k = 0; k < placed.size(); ++k) {
    auto* slot = new ArenaSlot{arena.shared_from_this(), placed[k]};
    c10::DataPtr owned(placed[k], slot, &free_arena_slot, device);
    out.emplace_back(c10::Storage::use_byte_size_t(), bytes[k], std::move(owned),
                     /*allocator=*/nullptr, /*resizable=*/false);
  }
  return out;
}

std::vector<c10::Storage> allocate_slots_beside(const std::vector<std::size_t>& bytes,
                                                SlotArenaMemory& arena) {
  std::vector<c10::Storage> out;
  for (std::size_t b : bytes) out.push_back(allocate_slot(b, arena.stream()));
  counters(arena.device()).misses += bytes.size();
  return out;
}

bool is_arena_slot(const c10::Storage& memory) {
  return memory.data_ptr().get_deleter() == &free_arena_slot;
}

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
  } else if (p.get_deleter() == &free_arena_slot) {
    auto* slot = static_cast<ArenaSlot*>(p.get_context());
    slot->arena->record_stream(slot->ptr, stream);
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
  const ArenaCounters& a = counters(device);
  return {static_cast<std::size_t>(s.allocated_bytes[all].current),
          static_cast<std::size_t>(s.allocated_bytes[all].peak),
          static_cast<std::size_t>(s.reserved_bytes[all].current),
          static_cast<std::size_t>(s.reserved_bytes[all].peak),
          a.bytes.load(), a.misses.load(), a.waits.load()};
}

void reset_slot_memory_peak(c10::DeviceIndex device) { native()->resetPeakStats(device); }

}  // namespace torch_uvm
