// Checkpoints of a private pool (pool_checkpoint.h).
//
// CUDA graph trees record graphs one after another into one pool. To record
// a graph that branches off an earlier point, they put the pool back the way
// it was there: every block then allocated is allocated again at the same
// address, everything else is free. The layout of a segment is rebuilt by
// splitting its one free block at the checkpoint's allocation boundaries;
// free stretches between allocations stay whole, as coalescing would leave
// them.
#include <set>
#include <unordered_map>

#include "core/block_split.h"
#include "core/caching_managed_allocator.h"
#include "core/errors.h"

namespace torch_uvm {

PoolCheckpoint CachingManagedAllocator::checkpoint_pool(PoolId pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(pools_.count(pool), "torch_uvm: no pool (", pool.first, ", ",
                      pool.second, ") to checkpoint");
  PoolCheckpoint out;
  out.pool = pool;
  for (const auto& [base, segment] : segments_) {
    if (segment->pool != pool) continue;
    PoolCheckpoint::SegmentState s{segment->base, segment->size, {}};
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      // A block freed but still waiting on events is free as far as a later
      // replay of the graph goes: nothing will read it again.
      s.blocks.push_back({b->ptr, b->size, b->requested, b->state == BlockState::kAllocated});
    }
    out.segments.push_back(std::move(s));
  }
  return out;
}

PoolRestore CachingManagedAllocator::restore_pool(const PoolCheckpoint& checkpoint) {
  std::unique_lock<std::mutex> lock(mutex_);
  // The pool's pending blocks become free first (waiting without the lock),
  // also those another thread is waiting on.
  if (captures_underway_ == 0) {
    drain_pending_waiting(lock);
    wait_until_settled(lock);
  }
  const PoolId pool = checkpoint.pool;
  auto it = pools_.find(pool);
  TORCH_UVM_CHECK_ARG(it != pools_.end() && it->second.use_count > 0, "torch_uvm: cannot restore "
                      "pool (", pool.first, ", ", pool.second, "): it was released");
  TORCH_UVM_CHECK_ARG(captures_underway_ == 0,
                      "torch_uvm: cannot restore a pool while a graph is being captured");
  // Check everything before changing anything.
  for (const auto& [base, segment] : segments_) {
    if (segment->pool != pool) continue;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      TORCH_UVM_CHECK_ARG(b->state != BlockState::kPendingFree,
                          "torch_uvm: cannot restore pool (", pool.first, ", ", pool.second,
                          "): a block freed after use on another stream is still fenced");
    }
  }
  std::set<const char*> seen;
  for (const auto& s : checkpoint.segments) {
    TORCH_UVM_CHECK_ARG(seen.insert(s.base).second,
                        "torch_uvm: a pool checkpoint that names a segment twice");
    auto seg = segments_.find(s.base);
    TORCH_UVM_CHECK_ARG(seg != segments_.end() && seg->second->pool == pool &&
                            seg->second->size == s.size,
                        "torch_uvm: cannot restore pool (", pool.first, ", ", pool.second,
                        "): its segment at ", hex(s.base), " is gone");
    std::size_t covered = 0;
    for (const auto& b : s.blocks) {
      TORCH_UVM_CHECK_ARG(b.ptr == s.base + covered && b.size > 0 &&
                              b.size % kMinBlockSize == 0 && b.requested <= b.size,
                          "torch_uvm: a pool checkpoint whose blocks do not tile their segment");
      covered += b.size;
    }
    TORCH_UVM_CHECK_ARG(covered == s.size,
                        "torch_uvm: a pool checkpoint whose blocks do not cover their segment");
  }

  PoolRestore result;
  // 1. Free every allocated block of the pool (no stream fences: the
  // caller has synchronized, as graph trees do before a checkpoint).
  std::vector<Block*> live;
  for (const auto& [ptr, block] : live_blocks_) {
    if (block->segment->pool == pool) live.push_back(block);
  }
  for (Block* b : live) {
    result.freed.push_back(b->ptr);
    live_blocks_.erase(b->ptr);
    take_back(b);
    return_to_pool(b);
  }
  // 2. Re-create the checkpoint's allocations, segment by segment.
  for (const auto& s : checkpoint.segments) {
    Segment* segment = segments_.at(s.base);
    Block* rest = segment->head;  // the whole segment, free
    pool_erase(rest);
    std::size_t free_run = 0;  // bytes of free blocks before the next allocation
    for (const auto& b : s.blocks) {
      if (!b.allocated) {
        free_run += b.size;
        continue;
      }
      if (free_run > 0) {  // leave the free stretch in front as one block
        Block* tail = split_block(rest, free_run);
        pool_insert(rest);
        rest = tail;
        free_run = 0;
      }
      Block* block = rest;
      rest = block->size > b.size ? split_block(block, b.size) : nullptr;
      hand_out(block, b.requested);
      result.allocated.push_back(AllocationInfo{block->ptr, block->size, block->requested,
                                                segment->home, segment->stream});
      if (rest == nullptr) break;
    }
    if (rest != nullptr) pool_insert(rest);
  }
  return result;
}

}  // namespace torch_uvm
