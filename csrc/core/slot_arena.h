// Where a share's slots are placed: one range of GPU memory the size of the
// share's budget, split and coalesced with its free neighbours anywhere in
// the range (block_split.h). What the slots hold can never pass the range:
// the GPU memory an offload streams through is its budget, in memory as in
// the books (core/residency.h).
//
// A slot goes at the start of the first free block that fits, from the one
// holding the end of the last slot placed, wrapping round (next fit). Streaming draws and lets go of
// slots in one order, pass after pass: placed so, they go round the range
// as a ring, and what they let go is next to what comes, where best fit
// leaves holes between slots of other sizes. An empty range starts again
// at its beginning: what is placed first (an offload's resident submodules)
// lies there in one piece, and the ring goes round after it.
//
// PyTorch's own allocator, which slots came from before, makes each cudaMalloc
// a segment of its own and never coalesces across them. With slots of mixed
// sizes (GPT-2's 16, 48 and 64 MiB weights) its reserved memory ran 20% over
// what it had allocated, and the books
// (benchmarks/results/2026-11-24-h100/*-before-arena.log).
//
// Reuse is stream-ordered, as PyTorch's: the range belongs to one stream (the
// executor's bring stream, which fills every slot). A block freed is reused
// by that stream at once; one that other streams used (record_stream) only
// once events recorded on them at the free have passed (pending_frees.h).
// When nothing fits, the arena waits for those events before it says no: a
// host running ahead of the GPU then waits for it, as a budget means.
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/block.h"
#include "core/pending_frees.h"
#include "core/runtime.h"

namespace torch_uvm {

class SlotArena {
 public:
  // `capacity` bytes at `base` (the caller's memory, kept alive beyond this),
  // on `stream`'s device.
  SlotArena(Runtime& runtime, void* base, std::size_t capacity, StreamRef stream);
  ~SlotArena();
  SlotArena(const SlotArena&) = delete;
  SlotArena& operator=(const SlotArena&) = delete;

  // What a block for `bytes` takes of the arena: rounded up to kMinBlockSize.
  static std::size_t block_bytes(std::size_t bytes);
  // Blocks of `bytes` each (rounded up to kMinBlockSize) for the arena's
  // stream, placed in order, all or none: empty when they do not all find
  // room even once every pending free has passed (the caller makes room, or
  // takes memory elsewhere). `wait`: false, blocks whose frees are still
  // pending are not waited for (what may come later needs no wait now).
  std::vector<void*> allocate_all(const std::vector<std::size_t>& bytes, bool wait = true);
  void* allocate(std::size_t bytes);  // one; nullptr when no room
  // `stream` uses the block at `ptr` too: on free, it is reused only once
  // that stream has passed the free.
  void record_stream(void* ptr, StreamRef stream);
  void free(void* ptr);

  StreamRef stream() const { return segment_.stream; }
  struct Stats {
    std::size_t allocated = 0, allocated_peak = 0;  // bytes in blocks handed out
    std::size_t waits = 0;   // allocations that waited for pending frees
  };
  Stats stats() const;

 private:
  // The first free block of `size` from the one holding the cursor,
  // wrapping round, or nullptr.
  Block* fit(std::size_t size);
  Block* place(std::size_t size);  // fit, split, allocated (not counted); or nullptr
  std::vector<void*> place_all(const std::vector<std::size_t>& bytes);  // all or none
  void wait_pending();  // (locked)
  void return_to_pool(Block* block);  // free: coalesced with free neighbours

  mutable std::mutex mutex_;
  Segment segment_;
  char* cursor_;  // the end of the last slot placed
  PendingFrees pending_;
  std::unordered_map<void*, Block*> allocated_;
  Stats stats_;
};

}  // namespace torch_uvm
