// What the allocator tells an observer: every allocation, free and segment,
// in order. The torch glue turns these into PyTorch's memory history (the
// trace that torch.cuda.memory._snapshot() returns and the memory visualizer
// draws); the policy itself knows nothing of stacks, Python or torch.
//
// The observer runs under the allocator's lock, so it must be quick and must
// not call back into the allocator or take a lock that a caller of the
// allocator may hold while allocating (Python's GIL among them).
#pragma once

#include <cstddef>
#include <functional>

#include "core/types.h"

namespace torch_uvm {

struct AllocatorEvent {
  enum Kind {
    kAlloc,          // a block handed out; size = bytes requested
    kFreeRequested,  // the user freed it; size = block size
    kFreeCompleted,  // it is reusable (at once, or after its stream events)
    kSegmentAlloc,   // a range obtained from the runtime
    kSegmentFree,    // a range returned to the runtime
    kOom,            // a request failed; size = bytes requested
  };
  Kind kind;
  const void* ptr = nullptr;
  std::size_t size = 0;
  DeviceIndex home = kCpuDevice;
  StreamRef stream;
  PoolId pool = kDefaultPool;
};

using AllocatorObserver = std::function<void(const AllocatorEvent&)>;

}  // namespace torch_uvm
