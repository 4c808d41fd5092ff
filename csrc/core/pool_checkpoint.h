// The state of a private pool, as CUDA graph trees (torch.compile's
// "reduce-overhead") save it after recording a graph and restore it before
// recording the next graph from the same point: which blocks of each segment
// were allocated, at which addresses.
#pragma once

#include <cstddef>
#include <vector>

#include "core/snapshot.h"
#include "core/types.h"

namespace torch_uvm {

struct PoolCheckpoint {
  struct BlockState {
    char* ptr = nullptr;
    std::size_t size = 0;
    std::size_t requested = 0;
    bool allocated = false;
  };
  struct SegmentState {
    char* base = nullptr;
    std::size_t size = 0;
    std::vector<BlockState> blocks;  // in address order, tiling the segment
  };
  PoolId pool = kDefaultPool;
  std::vector<SegmentState> segments;
};

// What a restore changed: the allocations it freed (the pool's live blocks
// before it) and the ones it made (the checkpoint's allocated blocks). A
// pointer may be in both.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<AllocationInfo> allocated;
};

}  // namespace torch_uvm
