// Private pools, pool checkpoints, per-device statistics, memory fractions,
// the lazy cap and the event observer: what PyTorch's CUDA allocator
// interface needs from the policy (csrc/torch/cuda_allocator.h).
#include <algorithm>
#include <unordered_set>

#include "core/errors.h"
#include "runtimes.h"

namespace torch_uvm::test {
namespace {

class PolicyTest : public testing::Test {
 protected:
  void SetUp() override { make({}); }
  void make(AllocatorConfig config) {
    allocator_.reset();
    runtime_ = std::make_shared<HostRuntime>(2, 1ull << 30);
    allocator_ = std::make_unique<CachingManagedAllocator>(runtime_, config);
  }
  void TearDown() override { allocator_->check_invariants(); }
  CachingManagedAllocator& a() { return *allocator_; }
  std::shared_ptr<HostRuntime> runtime_;
  std::unique_ptr<CachingManagedAllocator> allocator_;
};

const StreamRef kS{0, 0x10}, kCapture{0, 0x20}, kOther{1, 0x30};
const PoolId kPool{7, 1}, kPool2{7, 2};
auto captures(StreamRef s) {
  return [s](StreamRef t) { return t == s; };
}

// ---- statistics per home ----------------------------------------------------

TEST_F(PolicyTest, StatisticsArePerHomeAndTheTotalSeesAll) {
  void* g0 = a().allocate(1000, 0, kS);
  void* g1 = a().allocate(3 * kMiB, 1, kOther);
  void* cpu = a().allocate(512, kCpuDevice, kHostStream);
  EXPECT_EQ(a().stats(0).allocated_bytes.all().current, 1024);
  EXPECT_EQ(a().stats(0).reserved_bytes.all().current, int64_t(2 * kMiB));
  EXPECT_EQ(a().stats(1).allocated_bytes.all().current, int64_t(3 * kMiB));
  EXPECT_EQ(a().stats(kCpuDevice).allocation.all().current, 1);
  EXPECT_EQ(a().stats().allocation.all().current, 3);
  EXPECT_EQ(a().stats().allocated_bytes.all().current, int64_t(1024 + 3 * kMiB + 512));
  a().free(g1);
  // A peak reset of one GPU leaves the other homes' and the total's peaks.
  a().reset_peak_stats(1);
  EXPECT_EQ(a().stats(1).allocated_bytes.all().peak, 0);
  EXPECT_EQ(a().stats().allocated_bytes.all().peak, int64_t(1024 + 3 * kMiB + 512));
  a().reset_accumulated_stats(0);
  EXPECT_EQ(a().stats(0).allocation.all().allocated, 0);
  EXPECT_EQ(a().stats().allocation.all().allocated, 3);
  EXPECT_THROW(a().stats(2), InvalidArgument);
  a().free(g0);
  a().free(cpu);
}

// ---- the cap reads a GPU's memory only when the GPU is used -----------------

TEST_F(PolicyTest, NoDeviceMemoryIsReadUntilAGpuIsUsed) {
  EXPECT_TRUE(runtime_->counters().memory_info_reads.empty());
  void* p = a().allocate(4096, 1, kOther);
  auto reads = runtime_->counters().memory_info_reads;
  EXPECT_EQ(reads.count(0), 0u) << "GPU 0 was never used but its memory was read";
  EXPECT_EQ(reads[1], 1u);
  a().free(a().allocate(4096, 1, kOther));
  EXPECT_EQ(runtime_->counters().memory_info_reads[1], 1u);  // once per GPU
  a().free(p);
}

// ---- memory fraction ---------------------------------------------------------

TEST_F(PolicyTest, MemoryFractionLimitsOneGpuAndComposesWithTheCap) {
  EXPECT_EQ(a().memory_fraction(0), 1.0);
  a().set_memory_fraction(0, 1.0);  // PyTorch allows 1.0
  a().set_memory_fraction(0, 0.25);  // 256 MiB of GPU 0
  EXPECT_EQ(a().memory_fraction(0), 0.25);
  void* p = a().allocate(200 * kMiB, 0, kS);
  try {
    a().allocate(100 * kMiB, 0, kS);
    FAIL() << "the fraction did not limit GPU 0";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("memory fraction"), std::string::npos) << e.what();
  }
  void* q = a().allocate(100 * kMiB, 1, kOther);  // GPU 1 has no fraction
  EXPECT_THROW(a().set_memory_fraction(0, 1.5), InvalidArgument);
  EXPECT_THROW(a().set_memory_fraction(0, -0.1), InvalidArgument);
  EXPECT_THROW(a().set_memory_fraction(5, 0.5), InvalidArgument);
  a().free(p);
  a().free(q);
}

// ---- private pools -----------------------------------------------------------

TEST_F(PolicyTest, BlocksOfAPoolServeOnlyThatPool) {
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  EXPECT_EQ(a().pool_use_count(kPool), 1);
  void* in_pool = a().allocate(4096, 0, kCapture);
  void* outside = a().allocate(4096, 0, kS);  // another stream: ordinary cache
  a().free(in_pool);
  // Freed during the capture, the block is reused by the same capture.
  EXPECT_EQ(a().allocate(4096, 0, kCapture), in_pool);
  a().free(in_pool);
  a().end_allocate_to_pool(kPool);
  // After the capture, the same stream gets ordinary blocks, never the pool's.
  void* after = a().allocate(4096, 0, kCapture);
  EXPECT_NE(after, in_pool);
  auto snap = a().snapshot();
  auto pools = std::count_if(snap.begin(), snap.end(),
                             [](const SegmentSnapshot& s) { return s.pool == kPool; });
  EXPECT_EQ(pools, 1);
  a().free(after);
  a().free(outside);
}

TEST_F(PolicyTest, APoolIsKeptUntilItsLastUseIsReleased) {
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  void* p = a().allocate(3 * kMiB, 0, kCapture);
  a().free(p);
  a().end_allocate_to_pool(kPool);
  a().create_or_incref_pool(kPool);  // a second graph shares the pool
  EXPECT_EQ(a().pool_use_count(kPool), 2);
  a().release_pool(kPool);
  a().empty_cache();
  EXPECT_EQ(a().stats().segment.all().current, 1) << "a pool in use lost its segment";
  a().release_pool(kPool);
  EXPECT_EQ(a().pool_use_count(kPool), 0);
  a().empty_cache();
  EXPECT_EQ(a().stats().segment.all().current, 0);
  EXPECT_THROW(a().release_pool(kPool), InvalidArgument);
}

TEST_F(PolicyTest, AReleasedPoolEndsWhenItsLastBlockIsFreed) {
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  void* out = a().allocate(4096, 0, kCapture);  // a graph output that outlives the graph
  a().end_allocate_to_pool(kPool);
  a().release_pool(kPool);
  a().empty_cache();
  EXPECT_EQ(a().stats().segment.all().current, 1);
  a().free(out);
  a().empty_cache();
  EXPECT_EQ(a().stats().segment.all().current, 0);
}

TEST_F(PolicyTest, TwoPoolsAtOnceAndErrors) {
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  EXPECT_THROW(a().begin_allocate_to_pool(kPool, captures(kCapture)), InvalidArgument);
  a().begin_allocate_to_pool(kPool2, captures(kS));
  void* p1 = a().allocate(4096, 0, kCapture);
  void* p2 = a().allocate(4096, 0, kS);
  EXPECT_TRUE(a().pool_allocations_are(kPool, {p1}));
  EXPECT_TRUE(a().pool_allocations_are(kPool2, {p2}));
  EXPECT_FALSE(a().pool_allocations_are(kPool, {p1, p2}));
  EXPECT_FALSE(a().pool_allocations_are(kPool, {}));
  a().end_allocate_to_pool(kPool2);
  a().end_allocate_to_pool(kPool);
  EXPECT_THROW(a().end_allocate_to_pool(kPool), InvalidArgument);
  EXPECT_THROW(a().begin_allocate_to_pool(kDefaultPool, captures(kS)), InvalidArgument);
  a().free(p1);
  a().free(p2);
}

TEST_F(PolicyTest, NewSegmentsDuringACaptureAreAllowedButNotReleases) {
  void* cached = a().allocate(4096, 0, kS);
  a().free(cached);
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  auto before = runtime_->counters();
  void* p = a().allocate(30 * kMiB, 0, kCapture);
  a().empty_cache();  // must not free anything while capturing
  EXPECT_EQ(runtime_->counters().frees, before.frees);
  EXPECT_EQ(runtime_->counters().allocations, before.allocations + 1);
  a().free(p);
  a().end_allocate_to_pool(kPool);
  a().release_pool(kPool);
}

// ---- checkpoints -------------------------------------------------------------

TEST_F(PolicyTest, RestoringACheckpointRecreatesItsAllocationsAtTheirAddresses) {
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  char* x = static_cast<char*>(a().allocate(4096, 0, kCapture));
  char* y = static_cast<char*>(a().allocate(8192, 0, kCapture));
  char* z = static_cast<char*>(a().allocate(4096, 0, kCapture));
  a().free(y);  // a hole between x and z
  a().end_allocate_to_pool(kPool);
  PoolCheckpoint cp = a().checkpoint_pool(kPool);
  ASSERT_EQ(cp.segments.size(), 1u);

  // Later work changes the pool: z freed, w allocated into the hole, x freed.
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  a().free(z);
  void* w = a().allocate(8192, 0, kCapture);
  a().free(x);
  a().end_allocate_to_pool(kPool);
  a().release_pool(kPool);

  PoolRestore r = a().restore_pool(cp);
  std::unordered_set<void*> freed(r.freed.begin(), r.freed.end());
  EXPECT_EQ(freed, (std::unordered_set<void*>{w}));
  ASSERT_EQ(r.allocated.size(), 2u);
  EXPECT_EQ(r.allocated[0].base, x);
  EXPECT_EQ(r.allocated[0].requested, 4096u);
  EXPECT_EQ(r.allocated[1].base, z);
  EXPECT_TRUE(a().pool_allocations_are(kPool, {x, z}));
  a().check_invariants();
  // The hole is free again and serves the pool.
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  EXPECT_EQ(a().allocate(8192, 0, kCapture), y);
  a().free(y);
  a().end_allocate_to_pool(kPool);
  a().free(x);
  a().free(z);
  a().release_pool(kPool);
  a().release_pool(kPool);
}

TEST_F(PolicyTest, ARestoreThatCannotHoldChangesNothing) {
  a().begin_allocate_to_pool(kPool, captures(kCapture));
  void* p = a().allocate(4096, 0, kCapture);
  a().end_allocate_to_pool(kPool);
  PoolCheckpoint cp = a().checkpoint_pool(kPool);
  PoolCheckpoint bad = cp;
  bad.segments[0].blocks[0].size += 512;  // no longer tiles the segment
  EXPECT_THROW(a().restore_pool(bad), InvalidArgument);
  EXPECT_TRUE(a().pool_allocations_are(kPool, {p}));
  a().begin_allocate_to_pool(kPool2, captures(kS));
  EXPECT_THROW(a().restore_pool(cp), InvalidArgument);  // a capture is under way
  a().end_allocate_to_pool(kPool2);
  a().release_pool(kPool2);
  a().free(p);
  a().release_pool(kPool);
  a().empty_cache();  // the pool and its segment are gone
  EXPECT_THROW(a().restore_pool(cp), InvalidArgument);
}

// ---- the observer -------------------------------------------------------------

TEST_F(PolicyTest, TheObserverSeesEveryEventInOrder) {
  std::vector<AllocatorEvent> events;
  a().set_observer([&](const AllocatorEvent& e) { events.push_back(e); });
  void* p = a().allocate(1000, 0, kS);
  a().free(p);
  a().empty_cache();
  EXPECT_THROW(a().allocate(1ull << 40, 0, kS), OutOfMemoryError);
  a().set_observer(nullptr);
  std::vector<AllocatorEvent::Kind> kinds;
  for (const auto& e : events) kinds.push_back(e.kind);
  using K = AllocatorEvent;
  EXPECT_EQ(kinds, (std::vector<AllocatorEvent::Kind>{K::kSegmentAlloc, K::kAlloc,
                                                      K::kFreeRequested, K::kFreeCompleted,
                                                      K::kSegmentFree, K::kOom}));
  EXPECT_EQ(events[1].ptr, p);
  EXPECT_EQ(events[1].size, 1000u);
  EXPECT_EQ(events[0].size, 2 * kMiB);
  EXPECT_EQ(events[5].size, 1ull << 40);
}

TEST_F(PolicyTest, LargestFreeBlockAndSegmentLookup) {
  EXPECT_EQ(a().largest_free_block(0), 0u);
  void* p = a().allocate(3 * kMiB, 0, kS);
  EXPECT_EQ(a().largest_free_block(0), 17 * kMiB);  // the rest of a 20 MiB segment
  EXPECT_EQ(a().largest_free_block(1), 0u);
  auto [base, size] = a().segment_of(static_cast<char*>(p) + 100);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 20 * kMiB);
  int local = 0;
  EXPECT_EQ(a().segment_of(&local).first, nullptr);
  a().free(p);
}

}  // namespace
}  // namespace torch_uvm::test
