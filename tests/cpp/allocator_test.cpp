// Behaviour of CachingManagedAllocator that holds on every runtime.
#include <cstring>

#include "core/errors.h"
#include "runtimes.h"

namespace torch_uvm::test {
namespace {

const StreamRef kStream0{0, 0};

TEST_P(AllocatorTest, ZeroBytesIsNullAndFreeOfNullIsANoOp) {
  EXPECT_EQ(alloc().allocate(0, 0, kStream0), nullptr);
  alloc().free(nullptr);
  EXPECT_EQ(stat("allocation.all.current"), 0);
}

TEST_P(AllocatorTest, MemoryIsUsableFromTheHostAndRoundedTo512) {
  auto* p = static_cast<unsigned char*>(alloc().allocate(1000, kCpuDevice, kHostStream));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
  std::memset(p, 0xab, 1000);
  EXPECT_EQ(p[999], 0xab);
  auto info = alloc().find_allocation(p + 10);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->base, p);
  EXPECT_EQ(info->size, 1024u);
  EXPECT_EQ(info->requested, 1000u);
  EXPECT_EQ(info->home, kCpuDevice);
  EXPECT_EQ(stat("requested_bytes.all.current"), 1000);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 1024);
  alloc().free(p);
  EXPECT_FALSE(alloc().find_allocation(p).has_value());
}

TEST_P(AllocatorTest, SmallRequestsShareOneTwoMiBSegment) {
  void* a = alloc().allocate(1000, 0, kStream0);
  void* b = alloc().allocate(4000, 0, kStream0);
  EXPECT_EQ(stat("segment.small_pool.current"), 1);
  EXPECT_EQ(stat("reserved_bytes.small_pool.current"), int64_t(2 * kMiB));
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 1024);  // split tail
  EXPECT_EQ(stat("inactive_split.small_pool.current"), 1);
  alloc().free(a);
  alloc().free(b);
  // Everything coalesced back into one free block: no split remains.
  EXPECT_EQ(stat("inactive_split.all.current"), 0);
  EXPECT_EQ(stat("active_bytes.all.current"), 0);
  EXPECT_EQ(stat("reserved_bytes.all.current"), int64_t(2 * kMiB));
}

TEST_P(AllocatorTest, FreedBlockIsReusedOnTheSameStreamWithoutANewSegment) {
  void* a = alloc().allocate(3 * kMiB, 0, kStream0);
  alloc().free(a);
  void* b = alloc().allocate(3 * kMiB, 0, kStream0);
  EXPECT_EQ(a, b);
  EXPECT_EQ(stat("num_device_alloc"), 1);
  alloc().free(b);
}

TEST_P(AllocatorTest, BestFitPicksTheSmallestBlockThatFits) {
  // Three large segments of their own size (>= 10 MiB requests).
  void* a = alloc().allocate(12 * kMiB, 0, kStream0);
  void* b = alloc().allocate(16 * kMiB, 0, kStream0);
  void* c = alloc().allocate(14 * kMiB, 0, kStream0);
  alloc().free(a);
  alloc().free(b);
  alloc().free(c);
  EXPECT_EQ(alloc().allocate(13 * kMiB, 0, kStream0), c);
  EXPECT_EQ(alloc().allocate(11 * kMiB, 0, kStream0), a);
  EXPECT_EQ(stat("num_device_alloc"), 3);
  alloc().free(a);
  alloc().free(c);
}

TEST_P(AllocatorTest, LargeRequestsUnderTenMiBShareTwentyMiBSegments) {
  void* a = alloc().allocate(3 * kMiB, 0, kStream0);
  void* b = alloc().allocate(5 * kMiB, 0, kStream0);
  EXPECT_EQ(stat("segment.large_pool.current"), 1);
  EXPECT_EQ(stat("reserved_bytes.large_pool.current"), int64_t(20 * kMiB));
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), int64_t(3 * kMiB));
  alloc().free(b);
  alloc().free(a);
}

TEST_P(AllocatorTest, HugeRequestGetsItsOwnSegmentRoundedToTwoMiB) {
  void* a = alloc().allocate(33 * kMiB + 1, 0, kStream0);
  EXPECT_EQ(stat("reserved_bytes.large_pool.current"), int64_t(34 * kMiB));
  alloc().free(a);
}

TEST_P(AllocatorTest, StreamsDoNotShareFreeBlocks) {
  auto streams = GetParam().streams(2);
  void* a = alloc().allocate(1 * kMiB, 0, streams[0]);
  alloc().free(a);
  void* b = alloc().allocate(1 * kMiB, 0, streams[1]);
  EXPECT_NE(a, b);
  EXPECT_EQ(stat("segment.all.current"), 2);
  alloc().free(b);
}

TEST_P(AllocatorTest, HomesDoNotShareSegments) {
  void* cpu = alloc().allocate(4096, kCpuDevice, kHostStream);
  void* gpu = alloc().allocate(4096, 0, kStream0);
  EXPECT_EQ(stat("segment.all.current"), 2);
  EXPECT_EQ(alloc().find_allocation(gpu)->home, 0);
  alloc().free(cpu);
  alloc().free(gpu);
}

TEST_P(AllocatorTest, PeaksAndAccumulatedCountsFollowTorchSemantics) {
  void* a = alloc().allocate(10 * kKiB, 0, kStream0);
  void* b = alloc().allocate(20 * kKiB, 0, kStream0);
  alloc().free(a);
  EXPECT_EQ(stat("allocated_bytes.all.peak"), int64_t(30 * kKiB));
  EXPECT_EQ(stat("allocated_bytes.all.allocated"), int64_t(30 * kKiB));
  EXPECT_EQ(stat("allocated_bytes.all.freed"), int64_t(10 * kKiB));
  EXPECT_EQ(stat("allocation.all.allocated"), 2);
  alloc().reset_peak_stats();
  EXPECT_EQ(stat("allocated_bytes.all.peak"), int64_t(20 * kKiB));
  alloc().reset_accumulated_stats();
  EXPECT_EQ(stat("allocation.all.allocated"), 0);
  alloc().free(b);
}

TEST_P(AllocatorTest, EmptyCacheReturnsFreeSegmentsButKeepsLiveOnes) {
  void* keep = alloc().allocate(1 * kMiB, 0, kStream0);
  void* drop = alloc().allocate(12 * kMiB, 0, kStream0);
  alloc().free(drop);
  alloc().empty_cache();
  EXPECT_EQ(stat("segment.all.current"), 1);
  EXPECT_EQ(stat("num_device_free"), 1);
  alloc().free(keep);
  alloc().empty_cache();
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_P(AllocatorTest, ReleaseThresholdKeepsThatMuchCached) {
  AllocatorConfig config;
  config.release_threshold = 12 * kMiB;
  make(config);
  void* a = alloc().allocate(12 * kMiB, 0, kStream0);
  void* b = alloc().allocate(14 * kMiB, 0, kStream0);
  alloc().free(a);
  alloc().free(b);
  alloc().empty_cache();
  EXPECT_EQ(stat("reserved_bytes.all.current"), int64_t(12 * kMiB));
}

TEST_P(AllocatorTest, CapIsNeverExceededAndOomNamesRequestAndCap) {
  alloc().set_cap(40 * kMiB);
  void* a = alloc().allocate(30 * kMiB, 0, kStream0);
  try {
    alloc().allocate(30 * kMiB, 0, kStream0);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("30.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cap is 40.00 MiB"), std::string::npos) << msg;
  }
  EXPECT_EQ(stat("num_ooms"), 1);
  EXPECT_EQ(stat("num_alloc_retries"), 1);
  EXPECT_LE(stat("reserved_bytes.all.current"), int64_t(40 * kMiB));
  alloc().free(a);
  // After freeing, the same request succeeds again.
  void* b = alloc().allocate(30 * kMiB, 0, kStream0);
  EXPECT_NE(b, nullptr);
  alloc().free(b);
}

TEST_P(AllocatorTest, GpuMemoryHeldOutsideThePoolCountsAgainstTheCap) {
  alloc().set_cap(40 * kMiB);
  ASSERT_TRUE(alloc().reserve_outside(24 * kMiB));   // streamed slots, say
  EXPECT_THROW(alloc().allocate(20 * kMiB, 0, kStream0), OutOfMemoryError);
  void* a = alloc().allocate(12 * kMiB, 0, kStream0);
  EXPECT_FALSE(alloc().reserve_outside(8 * kMiB));   // nor the other way round
  EXPECT_EQ(alloc().outside_bytes(), 24 * kMiB);
  alloc().release_outside(24 * kMiB);
  EXPECT_TRUE(alloc().reserve_outside(8 * kMiB));
  alloc().release_outside(8 * kMiB);
  EXPECT_EQ(alloc().outside_bytes(), 0u);
  alloc().free(a);                                   // cached: still reserved
  EXPECT_GT(stat("reserved_bytes.all.current"), 0);
  EXPECT_TRUE(alloc().reserve_outside(36 * kMiB));   // the cache is released to make room
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
  alloc().release_outside(36 * kMiB);
}

TEST_P(AllocatorTest, OomReleasesCachedSegmentsOfOtherStreamsAndRetries) {
  auto streams = GetParam().streams(2);
  alloc().set_cap(40 * kMiB);
  void* a = alloc().allocate(30 * kMiB, 0, streams[0]);
  alloc().free(a);  // cached on stream 0 only
  void* b = alloc().allocate(30 * kMiB, 0, streams[1]);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(stat("num_alloc_retries"), 1);
  EXPECT_EQ(stat("num_ooms"), 0);
  alloc().free(b);
}

TEST_P(AllocatorTest, DefaultCapIsBelowFreeDeviceMemory) {
  EXPECT_GT(alloc().cap(), 0u);
  EXPECT_LT(alloc().cap(), alloc().safe_cap_limit());
  EXPECT_THROW(alloc().set_cap(alloc().safe_cap_limit() + 1), InvalidArgument);
}

TEST_P(AllocatorTest, CapBelowCurrentUseIsRefused) {
  void* a = alloc().allocate(12 * kMiB, 0, kStream0);
  EXPECT_THROW(alloc().set_cap(4 * kMiB), InvalidArgument);
  alloc().free(a);
  alloc().set_cap(4 * kMiB);  // the cached segment is released to fit
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_P(AllocatorTest, BadInputIsAClearErrorAndCorruptsNothing) {
  void* a = alloc().allocate(4096, 0, kStream0);
  int foreign = 0;
  EXPECT_THROW(alloc().free(&foreign), InvalidArgument);
  EXPECT_THROW(alloc().free(static_cast<char*>(a) + 8), InvalidArgument);
  EXPECT_THROW(alloc().allocate(SIZE_MAX, 0, kStream0), InvalidArgument);
  EXPECT_THROW(alloc().allocate(SIZE_MAX - 100, 0, kStream0), InvalidArgument);
  EXPECT_THROW(alloc().allocate(16, 99, kStream0), InvalidArgument);
  EXPECT_THROW(alloc().allocate(16, -2, kStream0), InvalidArgument);
  EXPECT_THROW(alloc().record_stream(&foreign, kStream0), InvalidArgument);
  alloc().free(a);
  try {
    alloc().free(a);
    FAIL() << "double free not detected";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("already freed"), std::string::npos);
  }
  alloc().check_invariants();
}

TEST_P(AllocatorTest, RequestLargerThanTheCapIsOom) {
  EXPECT_THROW(alloc().allocate(alloc().cap() + 1, 0, kStream0), OutOfMemoryError);
  EXPECT_EQ(stat("num_ooms"), 1);
}

TEST_P(AllocatorTest, MaxSplitSizeKeepsBigBlocksWhole) {
  AllocatorConfig config;
  config.max_split_size = 16 * kMiB;
  make(config);
  void* big = alloc().allocate(32 * kMiB, 0, kStream0);
  alloc().free(big);
  // A small request does not eat the oversize block.
  void* small = alloc().allocate(12 * kMiB, 0, kStream0);
  EXPECT_NE(small, big);
  EXPECT_EQ(stat("oversize_segments.current"), 1);
  alloc().free(small);
}

TEST_P(AllocatorTest, SnapshotShowsSegmentsAndBlockStates) {
  void* a = alloc().allocate(1000, 0, kStream0);
  auto snap = alloc().snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].segment_type, "small");
  EXPECT_EQ(snap[0].total_size, 2 * kMiB);
  ASSERT_EQ(snap[0].blocks.size(), 2u);
  EXPECT_EQ(snap[0].blocks[0].state, "active_allocated");
  EXPECT_EQ(snap[0].blocks[0].requested_size, 1000u);
  EXPECT_EQ(snap[0].blocks[1].state, "inactive");
  alloc().free(a);
}

TEST_P(AllocatorTest, RecordStreamDelaysReuseUntilTheOtherStreamIsDone) {
  auto streams = GetParam().streams(2);
  void* a = alloc().allocate(1 * kMiB, 0, streams[0]);
  alloc().record_stream(a, streams[1]);
  alloc().record_stream(a, streams[0]);  // own stream: nothing to wait for
  alloc().free(a);
  GetParam().finish_work(*runtime_);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  void* b = alloc().allocate(1 * kMiB, 0, streams[0]);
  EXPECT_EQ(a, b);  // the event completed: reused
  alloc().free(b);
  EXPECT_EQ(stat("active.all.current"), 0);
}

INSTANTIATE_TEST_SUITE_P(Runtimes, AllocatorTest, testing::ValuesIn(runtime_kinds()),
                         kind_name);

}  // namespace
}  // namespace torch_uvm::test
