// torch.cuda.memory_stats(d) and its resets: GPU d's own book of the
// allocator's statistics (core/stats.h), in c10's DeviceStats. The keys and
// meanings are the native allocator's, counted over the allocations whose
// home is GPU d; torch_uvm.memory_stats() is the whole picture, CPU-home
// memory included.
#include "core/errors.h"
#include "torch/cuda_allocator.h"
#include "torch/state.h"

namespace torch_uvm {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;

void copy_stat(const Stat& from, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_array(const StatArray& from, c10::CachingAllocator::StatArray& to) {
  for (int p = 0; p < kNumStatPools; ++p) copy_stat(from.pools[p], to[static_cast<std::size_t>(p)]);
}

}  // namespace

DeviceStats CudaAllocator::getDeviceStats(c10::DeviceIndex device) {
  MemoryStats s = translate_errors([&] { return core_.stats(device); });
  DeviceStats out;
  copy_array(s.allocation, out.allocation);
  copy_array(s.segment, out.segment);
  copy_array(s.active, out.active);
  copy_array(s.inactive_split, out.inactive_split);
  copy_array(s.allocated_bytes, out.allocated_bytes);
  copy_array(s.reserved_bytes, out.reserved_bytes);
  copy_array(s.active_bytes, out.active_bytes);
  copy_array(s.inactive_split_bytes, out.inactive_split_bytes);
  copy_array(s.requested_bytes, out.requested_bytes);
  copy_stat(s.oversize_allocations.all(), out.oversize_allocations);
  copy_stat(s.oversize_segments.all(), out.oversize_segments);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_sync_all_streams = s.num_sync_all_streams;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  out.max_split_size = s.max_split_size;
  return out;
}

void CudaAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  translate_errors([&] { core_.reset_accumulated_stats(device); });
}

void CudaAllocator::resetPeakStats(c10::DeviceIndex device) {
  translate_errors([&] { core_.reset_peak_stats(device); });
}

}  // namespace torch_uvm
