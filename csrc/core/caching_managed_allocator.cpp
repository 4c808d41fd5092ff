#include "core/caching_managed_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include "core/block_split.h"
#include "core/errors.h"

namespace torch_uvm {
namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

}  // namespace

CachingManagedAllocator::CachingManagedAllocator(std::shared_ptr<Runtime> runtime,
                                                 AllocatorConfig config)
    : runtime_(std::move(runtime)),
      policy_(config),
      cap_(*runtime_, config),
      release_threshold_(config.release_threshold),
      device_count_(runtime_->device_count()),
      pending_(*runtime_) {
  stats_.max_split_size = config.max_split_size == SIZE_MAX
                              ? 0
                              : static_cast<int64_t>(config.max_split_size);
  stats_.cap_bytes = static_cast<int64_t>(cap_.cap());
}

CachingManagedAllocator::~CachingManagedAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    drain_pending(/*wait=*/true);
  } catch (...) {
    // The runtime may be shutting down; the memory goes with the process.
  }
  for (auto& [base, segment] : segments_) {
    try {
      runtime_->free_managed(segment->base);
    } catch (...) {
    }
    for (Block* b = segment->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    delete segment;
  }
}

// ---- allocation ------------------------------------------------------------

void* CachingManagedAllocator::allocate(std::size_t bytes, DeviceIndex home,
                                        StreamRef stream) {
  if (bytes == 0) return nullptr;
  TORCH_UVM_CHECK_ARG(home == kCpuDevice || (home >= 0 && home < device_count_),
                      "cannot allocate managed memory for device ", home,
                      ": valid devices are cpu (-1) and 0..",
                      device_count_ - 1, " (", device_count_,
                      " GPU(s) present)");
  std::size_t size = policy_.round_request(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!pending_.empty() && captures_underway_ == 0) drain_pending(/*wait=*/false);
  Block* block = allocate_block(size, bytes, home, stream);

  const bool small = block->segment->small;
  block->state = BlockState::kAllocated;
  block->requested = bytes;
  ++block->segment->allocated_blocks;
  live_blocks_.emplace(block->ptr, block);
  stats_.allocation.increase(small, 1);
  stats_.allocated_bytes.increase(small, static_cast<int64_t>(block->size));
  stats_.active.increase(small, 1);
  stats_.active_bytes.increase(small, static_cast<int64_t>(block->size));
  stats_.requested_bytes.increase(small, static_cast<int64_t>(bytes));
  if (block->size >= policy_.config().max_split_size) {
    stats_.oversize_allocations.increase(small, 1);
  }
  return block->ptr;
}

Block* CachingManagedAllocator::allocate_block(std::size_t size,
                                               std::size_t requested,
                                               DeviceIndex home,
                                               StreamRef stream) {
  const bool small = policy_.is_small(size);
  if (Block* b = take_cached_block(size, home, stream, small)) return b;
  if (Block* b = new_segment(size, home, stream, small)) return b;
  if (captures_underway_ > 0) {
    ++stats_.num_ooms;
    throw_oom(requested, size, home,
              "a CUDA graph is being captured, so the cache cannot be released "
              "to make room");
  }
  // Slow path: give cached memory back to the runtime and try once more.
  ++stats_.num_alloc_retries;
  drain_pending(/*wait=*/true);
  if (Block* b = take_cached_block(size, home, stream, small)) return b;
  release_cached(/*keep=*/0);
  if (Block* b = new_segment(size, home, stream, small)) return b;
  ++stats_.num_ooms;
  std::size_t segment = policy_.segment_size(size);
  throw_oom(requested, size, home,
            cap_.admits(stats_.reserved_bytes.all().current, segment)
                ? "the device has no managed memory left"
                : "the request would exceed the managed memory cap");
}

Block* CachingManagedAllocator::take_cached_block(std::size_t size,
                                                  DeviceIndex home,
                                                  StreamRef stream, bool small) {
  BlockPool& pool = small ? small_pool_ : large_pool_;
  Block* block = pool.best_fit(home, stream, size);
  if (block == nullptr || !policy_.may_serve(block->size, size)) return nullptr;
  pool_erase(block);
  if (policy_.should_split(block->size, size)) {
    pool_insert(split_block(block, size));
  }
  return block;
}

Block* CachingManagedAllocator::new_segment(std::size_t size, DeviceIndex home,
                                            StreamRef stream, bool small) {
  std::size_t bytes = policy_.segment_size(size);
  if (!cap_.admits(static_cast<std::size_t>(stats_.reserved_bytes.all().current),
                   bytes)) {
    return nullptr;
  }
  void* base = runtime_->allocate_managed(bytes);
  if (base == nullptr) return nullptr;

  auto* segment = new Segment();
  segment->base = static_cast<char*>(base);
  segment->size = bytes;
  segment->home = home;
  segment->stream = stream;
  segment->small = small;
  try {
    advise_new_segment(*segment);
  } catch (...) {
    runtime_->free_managed(base);
    delete segment;
    throw;
  }
  auto* block = new Block();
  block->ptr = segment->base;
  block->size = bytes;
  block->segment = segment;
  segment->head = block;
  segments_.emplace(segment->base, segment);

  ++stats_.num_device_alloc;
  stats_.segment.increase(small, 1);
  stats_.reserved_bytes.increase(small, static_cast<int64_t>(bytes));
  if (bytes >= policy_.config().max_split_size) {
    stats_.oversize_segments.increase(small, 1);
  }
  if (policy_.should_split(block->size, size)) {
    pool_insert(split_block(block, size));
  }
  return block;
}

void CachingManagedAllocator::advise_new_segment(const Segment& segment) {
  // Advice on a fresh, unpopulated range is cheap; on populated memory it
  // costs ~16 ms per GiB. So the home's advice is set here, once per segment,
  // and never again on the hot path.
  if (!policy_.config().advise_segments || device_count_ == 0) return;
  if (segment.home == kCpuDevice) {
    runtime_->advise(segment.base, segment.size, Advice::kSetPreferredLocation,
                     kCpuDevice);
    runtime_->advise(segment.base, segment.size, Advice::kSetAccessedBy,
                     runtime_->current_device());
  } else {
    runtime_->advise(segment.base, segment.size, Advice::kSetPreferredLocation,
                     segment.home);
  }
}

void CachingManagedAllocator::throw_oom(std::size_t requested,
                                        std::size_t rounded, DeviceIndex home,
                                        const char* why) {
  const auto& reserved = stats_.reserved_bytes.all().current;
  const auto& allocated = stats_.allocated_bytes.all().current;
  throw OutOfMemoryError(detail::concat(
      "torch_uvm: out of managed memory: ", why, ". Tried to allocate ",
      format_bytes(requested), " (", format_bytes(rounded), " rounded) for ",
      device_name(home), "; the cap is ", format_bytes(cap_.cap()), ", ",
      format_bytes(static_cast<std::size_t>(allocated)), " is allocated and ",
      format_bytes(static_cast<std::size_t>(reserved)),
      " reserved after releasing the cache. Free tensors, lower the batch "
      "size, or raise the cap with torch_uvm.set_memory_cap() if the device "
      "has the memory."));
}

// ---- free ------------------------------------------------------------------

void CachingManagedAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_blocks_.find(static_cast<char*>(ptr));
  TORCH_UVM_CHECK_ARG(it != live_blocks_.end(), "torch_uvm: free(", hex(ptr),
                      "): not a live allocation of this allocator (it was "
                      "never allocated here, or was already freed)");
  Block* block = it->second;
  live_blocks_.erase(it);
  const bool small = block->segment->small;
  stats_.allocation.decrease(small, 1);
  stats_.allocated_bytes.decrease(small, static_cast<int64_t>(block->size));
  stats_.requested_bytes.decrease(small, static_cast<int64_t>(block->requested));
  if (block->size >= policy_.config().max_split_size) {
    stats_.oversize_allocations.decrease(small, 1);
  }
  if (block->stream_uses.empty()) {
    return_to_pool(block);
  } else if (captures_underway_ > 0) {
    block->state = BlockState::kPendingFree;
    parked_during_capture_.push_back(block);
  } else {
    pending_.defer(block);
  }
}

void CachingManagedAllocator::begin_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++captures_underway_;
}

void CachingManagedAllocator::end_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(captures_underway_ > 0, "torch_uvm: end_capture() without begin_capture()");
  if (--captures_underway_ > 0) return;
  // Events recorded now cover everything queued on those streams since the
  // frees: later than needed, never earlier.
  std::vector<Block*> parked;
  parked.swap(parked_during_capture_);
  for (Block* b : parked) pending_.defer(b);
}

void CachingManagedAllocator::return_to_pool(Block* block) {
  const bool small = block->segment->small;
  stats_.active.decrease(small, 1);
  stats_.active_bytes.decrease(small, static_cast<int64_t>(block->size));
  --block->segment->allocated_blocks;
  block->state = BlockState::kFree;
  block->requested = 0;
  block->stream_uses.clear();
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour && neighbour->state == BlockState::kFree) pool_erase(neighbour);
  }
  pool_insert(coalesce_block(block));
}

void CachingManagedAllocator::pool_insert(Block* block) {
  pool_of(block).insert(block);
  if (block->is_split()) {
    const bool small = block->segment->small;
    stats_.inactive_split.increase(small, 1);
    stats_.inactive_split_bytes.increase(small, static_cast<int64_t>(block->size));
  }
}

void CachingManagedAllocator::pool_erase(Block* block) {
  pool_of(block).erase(block);
  if (block->is_split()) {
    const bool small = block->segment->small;
    stats_.inactive_split.decrease(small, 1);
    stats_.inactive_split_bytes.decrease(small, static_cast<int64_t>(block->size));
  }
}

void CachingManagedAllocator::drain_pending(bool wait) {
  if (pending_.empty()) return;
  if (wait) ++stats_.num_sync_all_streams;
  std::vector<Block*> ready =
      wait ? pending_.take_all_synchronized() : pending_.take_completed();
  for (Block* b : ready) return_to_pool(b);
}

// ---- streams and lookup ----------------------------------------------------

Block* CachingManagedAllocator::find_live_block(const void* ptr) const {
  auto* p = static_cast<char*>(const_cast<void*>(ptr));
  auto it = live_blocks_.upper_bound(p);
  if (it == live_blocks_.begin()) return nullptr;
  --it;
  Block* b = it->second;
  return p < b->ptr + b->size ? b : nullptr;
}

void CachingManagedAllocator::record_stream(const void* ptr, StreamRef stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = find_live_block(ptr);
  TORCH_UVM_CHECK_ARG(block != nullptr, "torch_uvm: record_stream(", hex(ptr),
                      "): not a live allocation of this allocator");
  // CPU work is synchronous, and the allocation stream is ordered already.
  if (stream.device == kCpuDevice || stream == block->segment->stream) return;
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) {
    uses.push_back(stream);
  }
}

std::optional<AllocationInfo> CachingManagedAllocator::find_allocation(
    const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = find_live_block(ptr);
  if (b == nullptr) return std::nullopt;
  return AllocationInfo{b->ptr, b->size, b->requested, b->segment->home,
                        b->segment->stream};
}

// ---- releasing the cache ---------------------------------------------------

void CachingManagedAllocator::release_segment(Segment* segment) {
  Block* block = segment->head;
  pool_erase(block);
  runtime_->free_managed(segment->base);
  segments_.erase(segment->base);
  const bool small = segment->small;
  ++stats_.num_device_free;
  stats_.segment.decrease(small, 1);
  stats_.reserved_bytes.decrease(small, static_cast<int64_t>(segment->size));
  if (segment->size >= policy_.config().max_split_size) {
    stats_.oversize_segments.decrease(small, 1);
  }
  delete block;
  delete segment;
}

std::size_t CachingManagedAllocator::release_cached(std::size_t keep) {
  // Free segments, largest first: the fewest runtime calls return the most.
  std::vector<Segment*> free_segments;
  std::size_t cached = 0;
  for (auto& [base, segment] : segments_) {
    if (segment->allocated_blocks == 0) {
      free_segments.push_back(segment);
      cached += segment->size;
    }
  }
  std::sort(free_segments.begin(), free_segments.end(),
            [](const Segment* a, const Segment* b) { return a->size > b->size; });
  std::size_t released = 0;
  bool notified = false;
  for (Segment* segment : free_segments) {
    if (cached - released <= keep) break;
    if (cached - released - segment->size < keep) continue;  // keep it whole
    if (!notified && before_release_) before_release_();
    notified = true;
    released += segment->size;
    release_segment(segment);
  }
  return released;
}

void CachingManagedAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (captures_underway_ > 0) return;
  drain_pending(/*wait=*/true);
  release_cached(release_threshold_);
}

// ---- statistics, cap, snapshot ---------------------------------------------

MemoryStats CachingManagedAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingManagedAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_peak();
}

void CachingManagedAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_accumulated();
}

std::size_t CachingManagedAllocator::cap() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cap_.cap();
}

std::size_t CachingManagedAllocator::safe_cap_limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cap_.safe_limit();
}

void CachingManagedAllocator::set_cap(std::size_t bytes,
                                      bool allow_oversubscription) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (allow_oversubscription) cap_.set_allow_oversubscription(true);
  auto reserved = [&] {
    return static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  };
  if (reserved() > bytes && captures_underway_ == 0) {
    drain_pending(/*wait=*/true);
    release_cached(/*keep=*/0);
  }
  TORCH_UVM_CHECK_ARG(
      reserved() <= bytes, "torch_uvm: cannot set the managed memory cap to ",
      format_bytes(bytes), ": ", format_bytes(reserved()),
      " is in use by live tensors. Free tensors first, or choose a cap of at "
      "least that.");
  cap_.set(bytes);
  stats_.cap_bytes = static_cast<int64_t>(bytes);
}

void CachingManagedAllocator::set_before_release(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  before_release_ = std::move(hook);
}

void CachingManagedAllocator::set_release_threshold(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  release_threshold_ = bytes;
}

std::vector<SegmentSnapshot> CachingManagedAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SegmentSnapshot> out;
  for (const auto& [base, segment] : segments_) {
    SegmentSnapshot s;
    s.address = reinterpret_cast<std::uintptr_t>(segment->base);
    s.total_size = segment->size;
    s.home = segment->home;
    s.stream = segment->stream;
    s.segment_type = segment->small ? "small" : "large";
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      BlockSnapshot bs;
      bs.address = reinterpret_cast<std::uintptr_t>(b->ptr);
      bs.size = b->size;
      bs.requested_size = b->requested;
      switch (b->state) {
        case BlockState::kAllocated:
          bs.state = "active_allocated";
          s.allocated_size += b->size;
          s.active_size += b->size;
          break;
        case BlockState::kPendingFree:
          bs.state = "active_pending_free";
          s.active_size += b->size;
          break;
        case BlockState::kFree:
          bs.state = "inactive";
          break;
      }
      s.requested_size += b->requested;
      s.blocks.push_back(bs);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// ---- invariants ------------------------------------------------------------

void CachingManagedAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto fail = [](const std::string& what) { throw std::logic_error(what); };
  // Recomputed statistics, indexed [small].
  int64_t allocation[2] = {}, allocated_bytes[2] = {}, active[2] = {},
          active_bytes[2] = {}, requested[2] = {}, inactive[2] = {},
          inactive_bytes[2] = {}, segments[2] = {}, reserved[2] = {};
  std::size_t free_blocks[2] = {};
  const char* prev_end = nullptr;
  for (const auto& [base, segment] : segments_) {
    const int s = segment->small ? 1 : 0;
    if (prev_end != nullptr && base < prev_end) fail("segments overlap");
    prev_end = base + segment->size;
    ++segments[s];
    reserved[s] += static_cast<int64_t>(segment->size);
    if (segment->head == nullptr || segment->head->ptr != segment->base ||
        segment->head->prev != nullptr) {
      fail("segment head is not its first block");
    }
    std::size_t covered = 0, live = 0;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->segment != segment) fail("block points at another segment");
      if (b->ptr != segment->base + covered) fail("blocks do not tile segment");
      if (b->size == 0 || b->size % kMinBlockSize != 0) fail("bad block size");
      if (b->next && b->next->prev != b) fail("broken block links");
      covered += b->size;
      switch (b->state) {
        case BlockState::kFree: {
          if (b->next && b->next->state == BlockState::kFree) {
            fail("two adjacent free blocks were not coalesced");
          }
          const BlockPool& pool = segment->small ? small_pool_ : large_pool_;
          if (pool.blocks().count(const_cast<Block*>(b)) != 1) {
            fail("free block missing from its pool");
          }
          ++free_blocks[s];
          if (b->is_split()) {
            ++inactive[s];
            inactive_bytes[s] += static_cast<int64_t>(b->size);
          }
          if (b->requested != 0 || !b->stream_uses.empty()) {
            fail("free block keeps request state");
          }
          break;
        }
        case BlockState::kAllocated: {
          auto it = live_blocks_.find(b->ptr);
          if (it == live_blocks_.end() || it->second != b) {
            fail("allocated block missing from the live map");
          }
          ++allocation[s];
          allocated_bytes[s] += static_cast<int64_t>(b->size);
          requested[s] += static_cast<int64_t>(b->requested);
          ++active[s];
          active_bytes[s] += static_cast<int64_t>(b->size);
          ++live;
          if (b->requested > b->size) fail("requested exceeds block size");
          break;
        }
        case BlockState::kPendingFree:
          if (b->pending_events <= 0 &&
              std::find(parked_during_capture_.begin(), parked_during_capture_.end(), b) ==
                  parked_during_capture_.end()) {
            fail("pending block without events");
          }
          ++active[s];
          active_bytes[s] += static_cast<int64_t>(b->size);
          ++live;
          break;
      }
    }
    if (covered != segment->size) fail("blocks do not cover their segment");
    if (live != segment->allocated_blocks) fail("segment live count is wrong");
  }
  if (small_pool_.count() != free_blocks[1] || large_pool_.count() != free_blocks[0]) {
    fail("pools hold blocks that are not free blocks of a segment");
  }
  if (static_cast<int64_t>(live_blocks_.size()) != allocation[0] + allocation[1]) {
    fail("live map holds blocks that are not allocated");
  }
  auto agree = [&](const StatArray& a, const int64_t v[2], const char* name) {
    if (a.pools[kSmallPool].current != v[1] || a.pools[kLargePool].current != v[0] ||
        a.pools[kAllPools].current != v[0] + v[1]) {
      fail(std::string("statistic disagrees with the blocks: ") + name);
    }
  };
  agree(stats_.allocation, allocation, "allocation");
  agree(stats_.allocated_bytes, allocated_bytes, "allocated_bytes");
  agree(stats_.active, active, "active");
  agree(stats_.active_bytes, active_bytes, "active_bytes");
  agree(stats_.requested_bytes, requested, "requested_bytes");
  agree(stats_.inactive_split, inactive, "inactive_split");
  agree(stats_.inactive_split_bytes, inactive_bytes, "inactive_split_bytes");
  agree(stats_.segment, segments, "segment");
  agree(stats_.reserved_bytes, reserved, "reserved_bytes");
  if (static_cast<std::size_t>(stats_.reserved_bytes.all().current) > cap_.cap()) {
    fail("reserved bytes exceed the cap");
  }
}

}  // namespace torch_uvm
