// Looking at the allocator without changing it: snapshots, the largest free
// block, and the invariant check the tests run after every step.
#include <array>
#include <stdexcept>

#include "core/caching_managed_allocator.h"

namespace torch_uvm {

std::vector<SegmentSnapshot> CachingManagedAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SegmentSnapshot> out;
  for (const auto& [base, segment] : segments_) {
    SegmentSnapshot s;
    s.address = reinterpret_cast<std::uintptr_t>(segment->base);
    s.total_size = segment->size;
    s.home = segment->home;
    s.stream = segment->stream;
    s.pool = segment->pool;
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

std::size_t CachingManagedAllocator::largest_free_block(DeviceIndex home) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t largest = 0;
  for (const BlockPool* pool : {&small_pool_, &large_pool_}) {
    for (const Block* b : pool->blocks()) {
      const Segment& seg = *b->segment;
      if (seg.home == home && seg.pool == kDefaultPool && b->size > largest) largest = b->size;
    }
  }
  return largest;
}

void CachingManagedAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto fail = [](const std::string& what) { throw std::logic_error(what); };
  // Recomputed statistics, indexed [home + 1][small]; index 0 of the first
  // dimension is the CPU, the last one the total.
  const std::size_t books = static_cast<std::size_t>(device_count_) + 2;
  using Counts = std::vector<std::array<int64_t, 2>>;
  Counts allocation(books), allocated_bytes(books), active(books), active_bytes(books),
      requested(books), inactive(books), inactive_bytes(books), segments(books),
      reserved(books);
  auto add = [&](Counts& c, const Segment* seg, int64_t n) {
    const int s = seg->small ? 1 : 0;
    c[static_cast<std::size_t>(seg->home + 1)][s] += n;
    c[books - 1][s] += n;
  };
  std::size_t free_blocks[2] = {};
  // Segments being freed without the lock are still reserved.
  for (const Segment* segment : releasing_) {
    add(segments, segment, 1);
    add(reserved, segment, static_cast<int64_t>(segment->size));
    if (segment->allocated_blocks != 0 || segment->head->next != nullptr) {
      fail("a segment being released holds blocks in use");
    }
  }
  const char* prev_end = nullptr;
  for (const auto& [base, segment] : segments_) {
    const int s = segment->small ? 1 : 0;
    if (prev_end != nullptr && base < prev_end) fail("segments overlap");
    prev_end = base + segment->size;
    add(segments, segment, 1);
    add(reserved, segment, static_cast<int64_t>(segment->size));
    if (segment->pool != kDefaultPool && !pools_.count(segment->pool)) {
      fail("segment of a pool that no longer exists");
    }
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
            add(inactive, segment, 1);
            add(inactive_bytes, segment, static_cast<int64_t>(b->size));
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
          add(allocation, segment, 1);
          add(allocated_bytes, segment, static_cast<int64_t>(b->size));
          add(requested, segment, static_cast<int64_t>(b->requested));
          add(active, segment, 1);
          add(active_bytes, segment, static_cast<int64_t>(b->size));
          ++live;
          if (b->requested > b->size) fail("requested exceeds block size");
          break;
        }
        case BlockState::kPendingFree:
          if (b->pending_events <= 0 &&
              std::find(parked_during_capture_.begin(), parked_during_capture_.end(), b) ==
                  parked_during_capture_.end() &&
              std::find(pending_.unfenced().begin(), pending_.unfenced().end(), b) ==
                  pending_.unfenced().end()) {
            fail("pending block without events");
          }
          add(active, segment, 1);
          add(active_bytes, segment, static_cast<int64_t>(b->size));
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
  const auto& total_allocation = allocation[books - 1];
  if (static_cast<int64_t>(live_blocks_.size()) != total_allocation[0] + total_allocation[1]) {
    fail("live map holds blocks that are not allocated");
  }
  // Every book (each home, and the total) agrees with the blocks.
  for (std::size_t i = 0; i < books; ++i) {
    const MemoryStats& book =
        i == books - 1 ? stats_.total() : stats_.home(static_cast<DeviceIndex>(i) - 1);
    auto agree = [&](StatArray MemoryStats::*field, const Counts& c, const char* name) {
      const StatArray& a = book.*field;
      const auto& v = c[i];
      if (a.pools[kSmallPool].current != v[1] || a.pools[kLargePool].current != v[0] ||
          a.pools[kAllPools].current != v[0] + v[1]) {
        fail(std::string("statistic disagrees with the blocks: ") + name + " of " +
             (i == books - 1 ? std::string("the total")
                             : device_name(static_cast<DeviceIndex>(i) - 1)));
      }
    };
    agree(&MemoryStats::allocation, allocation, "allocation");
    agree(&MemoryStats::allocated_bytes, allocated_bytes, "allocated_bytes");
    agree(&MemoryStats::active, active, "active");
    agree(&MemoryStats::active_bytes, active_bytes, "active_bytes");
    agree(&MemoryStats::requested_bytes, requested, "requested_bytes");
    agree(&MemoryStats::inactive_split, inactive, "inactive_split");
    agree(&MemoryStats::inactive_split_bytes, inactive_bytes, "inactive_split_bytes");
    agree(&MemoryStats::segment, segments, "segment");
    agree(&MemoryStats::reserved_bytes, reserved, "reserved_bytes");
  }
  // Reserved bytes may exceed the cap: the default cap falls when a GPU with
  // less free memory is first used, and binds new reservations only.
  for (const auto& [id, pool] : pools_) {
    std::size_t n = 0;
    for (const auto& [base, segment] : segments_) n += segment->pool == id ? 1 : 0;
    for (const Segment* segment : releasing_) n += segment->pool == id ? 1 : 0;
    if (n != pool.segments) fail("a private pool's segment count is wrong");
    if (pool.use_count < 0) fail("a private pool's use count is negative");
  }
}

}  // namespace torch_uvm
