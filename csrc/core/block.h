// The allocator's two data structures. A Segment is one range obtained from the
// runtime; it is carved into Blocks that tile it exactly, linked in address
// order. Everything the allocator knows about memory is in these fields.
#pragma once

#include <cstddef>
#include <vector>

#include "core/types.h"

namespace torch_uvm {

struct Segment;

enum class BlockState {
  kFree,         // cached in a BlockPool, reusable on `stream`
  kAllocated,    // handed to a user
  kPendingFree,  // freed by the user, waiting for events on other streams
};

struct Block {
  char* ptr = nullptr;        // start; kMinBlockSize-aligned
  std::size_t size = 0;       // bytes, a multiple of kMinBlockSize
  std::size_t requested = 0;  // bytes asked for (0 unless allocated/pending)
  Segment* segment = nullptr;
  // Address-order neighbours within the segment. Invariant: prev->ptr +
  // prev->size == ptr, and two adjacent blocks are never both kFree (they are
  // coalesced when the second one is freed).
  Block* prev = nullptr;
  Block* next = nullptr;
  BlockState state = BlockState::kFree;
  // Streams other than segment->stream that used the block (record_stream).
  // On free, an event is recorded on each; the block is reused only once all
  // of them completed. Cleared when the block becomes kFree.
  std::vector<StreamRef> stream_uses;
  int pending_events = 0;  // events still outstanding while kPendingFree

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct Segment {
  char* base = nullptr;
  std::size_t size = 0;
  // The processor the segment's memory is advised to live on: the CPU for CPU
  // tensors, the GPU for CUDA tensors. Fixed for the segment's life, so the
  // advice is set once when the runtime hands the range over.
  DeviceIndex home = kCpuDevice;
  // The stream the segment's blocks are allocated on. A free block serves
  // requests on this stream at once; other streams never see it.
  StreamRef stream;
  // The private pool the segment belongs to (kDefaultPool for the ordinary
  // cache). Its blocks serve only requests routed to that pool.
  PoolId pool = kDefaultPool;
  bool small = false;   // belongs to the small pool
  Block* head = nullptr;  // the block at `base`
  std::size_t allocated_blocks = 0;  // blocks in kAllocated or kPendingFree
};

}  // namespace torch_uvm
