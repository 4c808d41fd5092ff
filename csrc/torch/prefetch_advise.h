// The one way the glue prefetches: explicit prefetch() and zero-copy moves.
#pragma once

#include <cstddef>

#include "core/types.h"

namespace torch_uvm {

// Migrates [ptr, ptr + bytes) to `target`, ordered on `stream`: kernels queued
// on `stream` afterwards see the pages resident. With `off_thread`, a GPU
// target and the async_prefetch option on, the driver call is issued by the
// PrefetchQueue's worker and this returns at once; otherwise the calling
// thread makes it. Reports an earlier asynchronous failure as a warning.
void schedule_prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                       StreamRef stream, bool off_thread);

}  // namespace torch_uvm
