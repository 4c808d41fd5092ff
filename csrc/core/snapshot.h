// A picture of every segment and block, for debugging fragmentation; shaped
// like the entries of torch.cuda.memory_snapshot().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"

namespace torch_uvm {

struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;
  // "active_allocated", "active_pending_free" or "inactive", as PyTorch's.
  std::string state;
};

struct SegmentSnapshot {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  DeviceIndex home = kCpuDevice;
  StreamRef stream;
  PoolId pool = kDefaultPool;
  std::string segment_type;  // "small" or "large"
  std::vector<BlockSnapshot> blocks;
};

// What the allocator knows about one live allocation.
struct AllocationInfo {
  void* base = nullptr;
  std::size_t size = 0;       // rounded
  std::size_t requested = 0;  // as asked
  DeviceIndex home = kCpuDevice;
  StreamRef stream;
};

}  // namespace torch_uvm
