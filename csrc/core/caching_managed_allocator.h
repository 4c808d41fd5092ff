// CachingManagedAllocator: a caching allocator over managed memory.
//
// Why: a managed allocation from the driver costs 5-25 us and frees synchronize;
// training loops allocate thousands of tensors a step. Like PyTorch's
// CUDACachingAllocator, freed blocks are kept and handed out again, so a cache
// hit costs a lookup and no driver call.
//
// How: segments come from the Runtime (size_policy.h decides how big), are
// split into blocks (block_split.h), and free blocks wait in two BlockPools,
// small and large, keyed by (home, stream). Reuse is stream-ordered; blocks
// used on other streams wait for events first (pending_frees.h). Reserved
// bytes never pass the MemoryCap (memory_cap.h). One allocator serves the CPU
// and every GPU: managed memory is reachable from all of them, and each
// segment's home fixes the advice set on it once.
//
// Private pools (graph_pools.cpp, pool_checkpoint.cpp) serve CUDA graphs:
// while a pool is being allocated to, requests on the streams it claims get
// blocks of that pool's own segments, reused only within the pool.
//
// Thread-safe: one mutex guards all state.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/allocator_events.h"
#include "core/block.h"
#include "core/block_pool.h"
#include "core/config.h"
#include "core/memory_cap.h"
#include "core/pending_frees.h"
#include "core/pool_checkpoint.h"
#include "core/runtime.h"
#include "core/size_policy.h"
#include "core/snapshot.h"
#include "core/stats.h"

namespace torch_uvm {

class CachingManagedAllocator {
 public:
  explicit CachingManagedAllocator(std::shared_ptr<Runtime> runtime,
                                   AllocatorConfig config = AllocatorConfig{});
  ~CachingManagedAllocator();
  CachingManagedAllocator(const CachingManagedAllocator&) = delete;
  CachingManagedAllocator& operator=(const CachingManagedAllocator&) = delete;

  // Returns `bytes` of managed memory whose home is `home` (kCpuDevice or a
  // GPU), for use on `stream`. Returns nullptr for 0 bytes. Throws
  // InvalidArgument for a bad device or a size that overflows, and
  // OutOfMemoryError when the cap or the device is exhausted after the cache
  // was released and the request retried.
  void* allocate(std::size_t bytes, DeviceIndex home, StreamRef stream);

  // Returns a block to the cache. nullptr is ignored. Throws InvalidArgument
  // for a pointer that is not a live allocation (foreign, or already freed).
  void free(void* ptr);

  // Marks the allocation holding `ptr` as used on `stream`: when freed, it is
  // reused only after the work queued on `stream` until then has completed.
  void record_stream(const void* ptr, StreamRef stream);

  // The live allocation containing `ptr`, if any.
  std::optional<AllocationInfo> find_allocation(const void* ptr) const;

  // Waits for pending frees and returns every fully free segment to the
  // runtime, keeping up to the release threshold cached. Does nothing while a
  // graph capture is under way.
  void empty_cache();

  // A CUDA graph capture began / ended (nestable). While one is under way,
  // the allocator makes no call that could break it: no event is recorded,
  // queried or waited on, and no segment is released. Blocks freed meanwhile
  // after use on other streams are parked until the last capture ends, then
  // wait for their events as usual.
  void begin_capture();
  void end_capture();

  // ---- private pools (graph_pools.cpp) ----
  // Creates `pool` with one use, or adds a use. The pool lives (its segments
  // stay reserved for it) until release_pool drops the last use.
  void create_or_incref_pool(PoolId pool);
  int pool_use_count(PoolId pool) const;
  // From now until end_allocate_to_pool, requests on streams for which
  // `filter` is true come from `pool` (created or incref'd here). Counts as a
  // capture (begin_capture) for as long. Throws InvalidArgument if `pool` is
  // already being allocated to.
  void begin_allocate_to_pool(PoolId pool, std::function<bool(StreamRef)> filter);
  void end_allocate_to_pool(PoolId pool);
  // Drops a use; at none, the pool's free segments go back to the runtime at
  // the next empty_cache() or out-of-memory retry, and the pool ends once its
  // last block is free.
  void release_pool(PoolId pool);
  // True iff the blocks allocated in `pool` are exactly `expected`.
  bool pool_allocations_are(PoolId pool,
                            const std::unordered_set<const void*>& expected) const;

  // ---- checkpoints of a pool (pool_checkpoint.cpp) ----
  // The layout of every segment of `pool`: what CUDA graph trees record
  // after a graph, to restore before recording another from the same state.
  PoolCheckpoint checkpoint_pool(PoolId pool) const;
  // Frees every block allocated in the pool, then re-creates the checkpoint's
  // allocated blocks at their addresses. Throws InvalidArgument, changing
  // nothing, if the pool or one of its segments is gone or a capture is
  // under way.
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);

  // Everything, or the allocations whose home is one processor.
  MemoryStats stats() const;
  MemoryStats stats(DeviceIndex home) const;
  void reset_peak_stats();
  void reset_peak_stats(DeviceIndex home);
  void reset_accumulated_stats();
  void reset_accumulated_stats(DeviceIndex home);
  std::vector<SegmentSnapshot> snapshot() const;
  // The largest cached free block whose home is `home`, 0 if none.
  std::size_t largest_free_block(DeviceIndex home) const;
  // The segment holding `ptr` (live or not): {base, size}, or {nullptr, 0}.
  std::pair<void*, std::size_t> segment_of(const void* ptr) const;

  // Told of every allocation, free and segment (allocator_events.h); an empty
  // function stops it.
  void set_observer(AllocatorObserver observer);

  // torch.cuda.set_per_process_memory_fraction for GPU `device`: bytes whose
  // home is `device` stay under fraction x its total memory. Releases cached
  // segments there if they exceed it. Throws InvalidArgument outside [0, 1].
  void set_memory_fraction(DeviceIndex device, double fraction);
  double memory_fraction(DeviceIndex device) const;

  // The cap on reserved bytes. set_cap first releases cached segments if the
  // reservation exceeds the new cap, and throws InvalidArgument if live
  // allocations alone exceed it or it is above the safe limit without
  // allow_oversubscription.
  std::size_t cap() const;
  std::size_t safe_cap_limit() const;

  // GPU memory torch_uvm holds outside its managed pool (streamed tensors'
  // slots, device memory from PyTorch's own caching allocator) counts
  // against the cap as reserved bytes do, so that the two together never
  // exceed it. reserve_outside takes `bytes` more if they fit, after
  // releasing the pool's cache if need be (false if they still do not);
  // release_outside gives them back.
  bool reserve_outside(std::size_t bytes);
  void release_outside(std::size_t bytes);
  std::size_t outside_bytes() const;
  void set_cap(std::size_t bytes, bool allow_oversubscription = false);
  void set_release_threshold(std::size_t bytes);

  // The first failure to advise a new segment since the last call, or "".
  // Advice is a hint: the segment is used anyway.
  std::string take_hint_error();

  // Called around the freeing of segments (without the allocator's lock),
  // whose runtime free may synchronize the whole device: whoever holds
  // streams waiting on a worker (PrefetchQueue) must let it issue everything
  // first and accept no new waits until `after` runs, or the free and the
  // worker wait on each other.
  void set_release_hooks(std::function<void()> before, std::function<void()> after);

  // fork() safety (the glue registers these with pthread_atfork): prepare
  // takes the allocator's lock so that no other thread holds it across the
  // fork; both after-handlers release it.
  void prepare_fork() { mutex_.lock(); }
  void after_fork() { mutex_.unlock(); }

  // Walks every segment and block and checks the structural invariants and
  // that the statistics agree with what is there. Throws std::logic_error
  // naming the first broken invariant. O(blocks); for tests and debugging.
  void check_invariants() const;

  Runtime& runtime() { return *runtime_; }
  const SizePolicy& policy() const { return policy_; }

 private:
  // Where a request lands: the (home, stream, pool) a block must match.
  struct Placement {
    DeviceIndex home;
    StreamRef stream;
    PoolId pool;
  };
  PoolId pool_for(StreamRef stream) const;
  Block* take_cached_block(std::size_t size, const Placement& where, bool small);
  Block* new_segment(std::size_t size, const Placement& where, bool small);
  Block* allocate_block(std::size_t size, std::size_t requested, const Placement& where,
                        std::unique_lock<std::mutex>& lock);
  void hand_out(Block* block, std::size_t requested);
  void take_back(Block* block);
  void notify(AllocatorEvent::Kind kind, const Block* block, std::size_t size);
  void advise_new_segment(const Segment& segment);
  // Releasing cached segments, in two steps so that no driver call is made
  // with the lock held (a free may synchronize the device). Under the lock,
  // detach_releasable takes fully free segments of the ordinary pool and of
  // released private pools out of the cache, largest first, while more than
  // `keep` bytes are cached; their bytes stay reserved (the cap holds) until
  // freed. free_detached then unlocks, frees them, locks again and settles
  // the books; a segment whose free failed returns to the cache. Returns the
  // first failure's message, or "".
  std::vector<Segment*> detach_releasable(std::size_t keep);
  std::string free_detached(std::vector<Segment*> segments, std::unique_lock<std::mutex>& lock);
  std::string release_cached(std::size_t keep, std::unique_lock<std::mutex>& lock) {
    return free_detached(detach_releasable(keep), lock);
  }
  bool releasable(const Segment& segment) const;
  void forget_empty_pools();
  // Returns the blocks whose events completed to their pools; with `lock`,
  // waits for all events first, without holding it.
  void drain_pending();
  void drain_pending_waiting(std::unique_lock<std::mutex>& lock);
  // Waits until no other thread is freeing segments or waiting on events
  // with the lock released (their bytes and blocks are out of reach then).
  void wait_until_settled(std::unique_lock<std::mutex>& lock);
  void defer_free(Block* block);
  void return_to_pool(Block* block);
  void pool_insert(Block* block);
  void pool_erase(Block* block);
  BlockPool& pool_of(const Block* block) {
    return block->segment->small ? small_pool_ : large_pool_;
  }
  Block* find_live_block(const void* ptr) const;
  [[noreturn]] void throw_oom(std::size_t requested, std::size_t rounded,
                              const Placement& where, const char* why);
  std::size_t reserved_on(DeviceIndex home) const {
    return static_cast<std::size_t>(stats_.home(home).reserved_bytes.all().current);
  }

  std::shared_ptr<Runtime> runtime_;
  SizePolicy policy_;
  mutable MemoryCap cap_;
  std::size_t release_threshold_;
  int device_count_;

  mutable std::mutex mutex_;
  std::size_t outside_ = 0;  // reserve_outside's, under mutex_
  BlockPool small_pool_;
  BlockPool large_pool_;
  PendingFrees pending_;
  std::map<char*, Segment*> segments_;     // by base address
  std::map<char*, Block*> live_blocks_;    // kAllocated, by address
  int captures_underway_ = 0;
  std::function<void()> before_release_, after_release_;
  std::vector<Segment*> releasing_;  // detached, being freed without the lock
  int in_flight_ = 0;                // releases and event waits under way unlocked
  std::condition_variable settled_;  // notified when one ends
  std::vector<Block*> parked_during_capture_;  // kPendingFree, no events yet
  StatsBook stats_;
  std::string hint_error_;
  std::atomic<bool> has_hint_error_{false};
  AllocatorObserver observer_;

  struct PrivatePool {
    int use_count = 0;      // 0: released, ends with its last segment
    std::size_t segments = 0;
  };
  std::map<PoolId, PrivatePool> pools_;
  // Pools being allocated to, in the order begun; the first whose filter
  // takes a request's stream serves it.
  std::vector<std::pair<PoolId, std::function<bool(StreamRef)>>> allocating_to_;
};

}  // namespace torch_uvm
