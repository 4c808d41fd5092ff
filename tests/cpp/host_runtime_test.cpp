// Behaviour that needs the host runtime's controls: counted driver calls,
// events that complete when the test says so, injected device OOM.
#include "core/errors.h"
#include "runtimes.h"

namespace torch_uvm::test {
namespace {

class HostAllocatorTest : public testing::Test {
 protected:
  void SetUp() override { make({}); }
  void make(AllocatorConfig config, std::size_t memory = 1ull << 30) {
    allocator_.reset();
    runtime_ = std::make_shared<HostRuntime>(2, memory);
    allocator_ = std::make_unique<CachingManagedAllocator>(runtime_, config);
  }
  void TearDown() override { allocator_->check_invariants(); }
  std::shared_ptr<HostRuntime> runtime_;
  std::unique_ptr<CachingManagedAllocator> allocator_;
};

const StreamRef kA{0, 0x10}, kB{0, 0x20}, kC{1, 0x30};

TEST_F(HostAllocatorTest, CacheHitMakesNoRuntimeCall) {
  void* p = allocator_->allocate(4096, 0, kA);
  allocator_->free(p);
  auto before = runtime_->counters();
  for (int i = 0; i < 1000; ++i) allocator_->free(allocator_->allocate(4096, 0, kA));
  auto after = runtime_->counters();
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.advises, before.advises);
  EXPECT_EQ(after.event_queries, before.event_queries);
  EXPECT_EQ(after.event_records, before.event_records);
}

TEST_F(HostAllocatorTest, AdviceIsSetOncePerSegmentForItsHome) {
  void* gpu = allocator_->allocate(4096, 1, kC);
  void* cpu = allocator_->allocate(4096, kCpuDevice, kHostStream);
  auto g = runtime_->advice_for(gpu);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].first, Advice::kSetPreferredLocation);
  EXPECT_EQ(g[0].second, 1);
  auto c = runtime_->advice_for(cpu);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0], std::make_pair(Advice::kSetPreferredLocation, kCpuDevice));
  EXPECT_EQ(c[1], std::make_pair(Advice::kSetAccessedBy, 0));
  // A second block of the same segment adds no advice.
  void* gpu2 = allocator_->allocate(4096, 1, kC);
  EXPECT_EQ(runtime_->counters().advises, 3u);
  allocator_->free(gpu);
  allocator_->free(gpu2);
  allocator_->free(cpu);
}

TEST_F(HostAllocatorTest, AdviceCanBeTurnedOff) {
  AllocatorConfig config;
  config.advise_segments = false;
  make(config);
  allocator_->free(allocator_->allocate(4096, 0, kA));
  EXPECT_EQ(runtime_->counters().advises, 0u);
}

TEST_F(HostAllocatorTest, BlockUsedOnAnotherStreamWaitsForItsEvent) {
  runtime_->set_auto_complete_events(false);
  void* p = allocator_->allocate(1 << 20, 0, kA);
  allocator_->record_stream(p, kB);
  allocator_->record_stream(p, kC);
  allocator_->record_stream(p, kB);  // recorded once
  allocator_->free(p);
  auto stat = [&](const char* key) {
    for (auto& [k, v] : flatten(allocator_->stats())) if (k == key) return v;
    return int64_t(-1);
  };
  EXPECT_EQ(runtime_->counters().event_records, 2u);
  // Freed for torch's accounting, still active, and not reusable on A.
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat("active_bytes.all.current"), 1 << 20);
  void* q = allocator_->allocate(1 << 20, 0, kA);
  EXPECT_NE(q, p);
  allocator_->free(q);
  // One stream finished: still waiting for the other.
  runtime_->complete_events(&kB);
  void* r = allocator_->allocate(1 << 20, 0, kA);
  EXPECT_NE(r, p);
  allocator_->free(r);
  runtime_->complete_events(&kC);
  void* s = allocator_->allocate(1 << 20, 0, kA);
  EXPECT_EQ(s, p);
  allocator_->free(s);
  EXPECT_EQ(stat("active_bytes.all.current"), 0);
}

TEST_F(HostAllocatorTest, EmptyCacheWaitsForPendingFrees) {
  runtime_->set_auto_complete_events(false);
  void* p = allocator_->allocate(1 << 20, 0, kA);
  allocator_->record_stream(p, kB);
  allocator_->free(p);
  allocator_->empty_cache();
  EXPECT_EQ(runtime_->counters().event_syncs, 1u);
  EXPECT_EQ(runtime_->bytes_in_use(), 0u);
}

// During a CUDA graph capture any event call or release would break the
// capture: the allocator makes none, and catches up when the capture ends.
TEST_F(HostAllocatorTest, DuringGraphCaptureNoEventOrReleaseCallIsMade) {
  runtime_->set_auto_complete_events(false);
  void* p = allocator_->allocate(1 << 20, 0, kA);
  allocator_->record_stream(p, kB);
  void* cached = allocator_->allocate(8 << 20, 0, kA);
  allocator_->free(cached);
  allocator_->begin_capture();
  auto before = runtime_->counters();
  allocator_->free(p);                       // used on B: parked, no event yet
  void* q = allocator_->allocate(1 << 20, 0, kA);
  EXPECT_NE(q, p);                           // not reused while B may read it
  allocator_->free(q);
  allocator_->empty_cache();                 // a no-op during capture
  allocator_->check_invariants();
  auto during = runtime_->counters();
  EXPECT_EQ(during.event_records, before.event_records);
  EXPECT_EQ(during.event_queries, before.event_queries);
  EXPECT_EQ(during.event_syncs, before.event_syncs);
  EXPECT_EQ(during.frees, before.frees);
  allocator_->end_capture();                 // now the event is recorded on B
  EXPECT_EQ(runtime_->counters().event_records, before.event_records + 1);
  void* r = allocator_->allocate(1 << 20, 0, kA);
  EXPECT_NE(r, p);                           // B has not finished
  allocator_->free(r);
  runtime_->complete_events(&kB);
  void* s = allocator_->allocate(1 << 20, 0, kA);
  EXPECT_EQ(s, p);
  allocator_->free(s);
  EXPECT_THROW(allocator_->end_capture(), InvalidArgument);
}

TEST_F(HostAllocatorTest, NestedCapturesReleaseParkedBlocksAfterTheLast) {
  void* p = allocator_->allocate(4096, 0, kA);
  allocator_->record_stream(p, kB);
  allocator_->begin_capture();
  allocator_->begin_capture();
  allocator_->free(p);
  allocator_->end_capture();
  auto records = runtime_->counters().event_records;
  allocator_->end_capture();
  EXPECT_EQ(runtime_->counters().event_records, records + 1);
}

TEST_F(HostAllocatorTest, EventsAreReused) {
  for (int i = 0; i < 10; ++i) {
    void* p = allocator_->allocate(4096, 0, kA);
    allocator_->record_stream(p, kB);
    allocator_->free(p);
    allocator_->free(allocator_->allocate(4096, 0, kA));  // polls the event
  }
  EXPECT_EQ(runtime_->counters().events_created, 1u);
}

TEST_F(HostAllocatorTest, DeviceOomReleasesTheCacheAndRetries) {
  void* a = allocator_->allocate(12 << 20, 0, kA);
  allocator_->free(a);
  runtime_->fail_next_allocations(1);
  void* b = allocator_->allocate(14 << 20, 0, kA);
  EXPECT_NE(b, nullptr);
  auto stats = allocator_->stats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_device_free, 1);  // the cached 12 MiB went back first
  allocator_->free(b);
}

TEST_F(HostAllocatorTest, DeviceOomAfterRetryNamesTheDevice) {
  runtime_->fail_next_allocations(2);
  try {
    allocator_->allocate(4096, 1, kC);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no managed memory left"), std::string::npos);
  }
  // The allocator goes on working.
  allocator_->free(allocator_->allocate(4096, 1, kC));
}

TEST_F(HostAllocatorTest, CapDefaultsToAFractionOfTheSmallestFreeMemory) {
  EXPECT_EQ(allocator_->safe_cap_limit(), 1ull << 30);
  EXPECT_EQ(allocator_->cap(), static_cast<std::size_t>(0.8 * (1ull << 30)));
  AllocatorConfig config;
  config.cap_bytes = 2ull << 30;
  make(config);  // checked when a GPU's free memory is first read
  EXPECT_THROW(allocator_->allocate(4096, 0, kA), InvalidArgument);
  EXPECT_EQ(runtime_->bytes_in_use(), 0u);
  config.allow_oversubscription = true;
  make(config);
  EXPECT_EQ(allocator_->cap(), 2ull << 30);
}

TEST_F(HostAllocatorTest, NoDeviceMeansNoManagedMemory) {
  allocator_.reset();
  runtime_ = std::make_shared<HostRuntime>(0, 1ull << 30);
  allocator_ = std::make_unique<CachingManagedAllocator>(runtime_);
  EXPECT_EQ(allocator_->cap(), 0u);
  EXPECT_THROW(allocator_->allocate(16, kCpuDevice, kHostStream), OutOfMemoryError);
}

}  // namespace
}  // namespace torch_uvm::test
