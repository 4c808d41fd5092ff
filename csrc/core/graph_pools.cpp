// Private pools: what CUDA graphs need from an allocator.
//
// A graph replays the addresses it captured. So blocks allocated while a
// graph is captured must not be handed to anyone else until the graph is
// gone, and blocks the capture freed may be reused only by later allocations
// of the same capture. A private pool gives exactly that: its own segments,
// whose blocks serve only requests routed to it (begin_allocate_to_pool's
// filter decides which streams), kept until its last use is released.
// Several graphs may share one pool (torch.cuda.graph_pool_handle()), which
// is why a pool counts uses.
#include <stdexcept>

#include "core/caching_managed_allocator.h"
#include "core/errors.h"

namespace torch_uvm {

PoolId CachingManagedAllocator::pool_for(StreamRef stream) const {
  for (const auto& [pool, filter] : allocating_to_) {
    if (filter(stream)) return pool;
  }
  return kDefaultPool;
}

void CachingManagedAllocator::create_or_incref_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(pool != kDefaultPool, "torch_uvm: pool id (0, 0) is the ordinary pool");
  ++pools_[pool].use_count;
}

int CachingManagedAllocator::pool_use_count(PoolId pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? 0 : it->second.use_count;
}

void CachingManagedAllocator::begin_allocate_to_pool(PoolId pool,
                                                     std::function<bool(StreamRef)> filter) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(pool != kDefaultPool, "torch_uvm: pool id (0, 0) is the ordinary pool");
  for (const auto& entry : allocating_to_) {
    TORCH_UVM_CHECK_ARG(entry.first != pool, "torch_uvm: already allocating to pool (",
                        pool.first, ", ", pool.second, ")");
  }
  ++pools_[pool].use_count;
  allocating_to_.emplace_back(pool, std::move(filter));
  ++captures_underway_;
}

void CachingManagedAllocator::end_allocate_to_pool(PoolId pool) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocating_to_.begin();
    while (it != allocating_to_.end() && it->first != pool) ++it;
    TORCH_UVM_CHECK_ARG(it != allocating_to_.end(), "torch_uvm: not allocating to pool (",
                        pool.first, ", ", pool.second, ")");
    allocating_to_.erase(it);
  }
  end_capture();
}

void CachingManagedAllocator::release_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pools_.find(pool);
  TORCH_UVM_CHECK_ARG(it != pools_.end() && it->second.use_count > 0,
                      "torch_uvm: release of pool (", pool.first, ", ", pool.second,
                      "), which has no use left");
  --it->second.use_count;
  forget_empty_pools();
}

bool CachingManagedAllocator::releasable(const Segment& segment) const {
  if (segment.pool == kDefaultPool) return true;
  auto it = pools_.find(segment.pool);
  return it == pools_.end() || it->second.use_count == 0;
}

void CachingManagedAllocator::forget_empty_pools() {
  for (auto it = pools_.begin(); it != pools_.end();) {
    it = it->second.use_count == 0 && it->second.segments == 0 ? pools_.erase(it) : std::next(it);
  }
}

bool CachingManagedAllocator::pool_allocations_are(
    PoolId pool, const std::unordered_set<const void*>& expected) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(pools_.count(pool), "torch_uvm: no pool (", pool.first, ", ",
                      pool.second, ")");
  std::size_t found = 0;
  for (const auto& [ptr, block] : live_blocks_) {
    if (block->segment->pool != pool) continue;
    if (!expected.count(ptr)) return false;
    ++found;
  }
  return found == expected.size();
}

}  // namespace torch_uvm
