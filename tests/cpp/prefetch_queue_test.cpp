// PrefetchQueue: prefetches leave the caller's thread, the consumer stream is
// ordered after them by a flag, and the flag is released whatever happens.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/caching_managed_allocator.h"
#include "core/errors.h"
#include "core/prefetch_queue.h"
#include "runtime/faulty_runtime.h"
#include "runtime/host_runtime.h"

#include <chrono>
#include <thread>

#ifdef TORCH_UVM_TEST_CUDA
#include <cuda_runtime_api.h>

#include "runtime/gpu_runtime.h"
#endif

namespace torch_uvm {
namespace {

constexpr std::size_t kMiB = 1u << 20;
constexpr StreamRef kConsumer{0, 0x77};

TEST(PrefetchQueue, SubmitReturnsBeforeThePrefetchIsIssued) {
  HostRuntime rt;
  PrefetchQueue q(rt, {});
  rt.hold_prefetches(true);  // the driver holds whoever calls it
  char buf[64];
  ASSERT_TRUE(q.submit(buf, sizeof(buf), 0, kConsumer));  // returns anyway
  EXPECT_EQ(rt.counters().flag_waits, 1u);                 // consumer ordered
  EXPECT_EQ(q.counters().issued, 0u);
  rt.hold_prefetches(false);
  q.drain();
  EXPECT_EQ(q.counters().issued, 1u);
  ASSERT_EQ(rt.prefetch_log().size(), 1u);
}

// The ordering itself, which a data check cannot see (a prefetch never
// changes data): work recorded on the consumer stream after a submit does
// not complete until the worker has issued the prefetch and written the
// ticket. The host runtime honours stream waits, so a wrong ticket fails here.
TEST(PrefetchQueue, TheConsumerStreamWaitsForTheWorkersPrefetch) {
  HostRuntime rt;
  PrefetchQueue q(rt, {});
  rt.hold_prefetches(true);
  char buf[64];
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(q.submit(buf, sizeof(buf), 0, kConsumer));
    EventHandle after = rt.create_event(0);
    rt.record_event(after, kConsumer);  // "a kernel queued after the move"
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(rt.query_event(after)) << "the consumer ran before the prefetch was issued";
    rt.hold_prefetches(false);
    q.drain();
    EXPECT_TRUE(rt.query_event(after));
    rt.synchronize_event(after);
    rt.destroy_event(after);
    rt.hold_prefetches(true);
  }
  rt.hold_prefetches(false);
}

TEST(PrefetchQueue, IssuesInOrderOnItsOwnStreamAndReleasesEachTicket) {
  HostRuntime rt(2);
  PrefetchQueue q(rt, {});
  std::vector<char> buf(3 * kMiB);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(q.submit(buf.data() + i * kMiB, kMiB, 0, kConsumer));
  }
  ASSERT_TRUE(q.submit(buf.data(), 16, 1, StreamRef{1, 0x88}));
  q.drain();
  auto log = rt.prefetch_log();
  ASSERT_EQ(log.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(log[i].ptr, buf.data() + i * kMiB);
    EXPECT_EQ(log[i].target, 0);
    EXPECT_EQ(log[i].stream.device, 0);
    EXPECT_NE(log[i].stream, kConsumer);  // the queue's stream, not the caller's
  }
  EXPECT_EQ(log[3].stream.device, 1);  // one lane per consumer device
  EXPECT_EQ(rt.counters().flag_writes, 4u);
  EXPECT_EQ(q.counters().submitted, 4u);
  EXPECT_EQ(q.counters().failed, 0u);
}

TEST(PrefetchQueue, ChunksLargePrefetches) {
  HostRuntime rt;
  PrefetchQueue q(rt, {/*chunk_bytes=*/kMiB});
  std::vector<char> buf(5 * kMiB / 2);
  ASSERT_TRUE(q.submit(buf.data(), buf.size(), 0, kConsumer));
  q.drain();
  auto log = rt.prefetch_log();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].bytes, kMiB);
  EXPECT_EQ(log[1].ptr, buf.data() + kMiB);
  EXPECT_EQ(log[2].bytes, kMiB / 2);
}

TEST(PrefetchQueue, AFailedPrefetchStillReleasesTheConsumer) {
  HostRuntime rt;
  PrefetchQueue q(rt, {});
  rt.fail_next_prefetches(1);
  char buf[64];
  ASSERT_TRUE(q.submit(buf, sizeof(buf), 0, kConsumer));
  ASSERT_TRUE(q.submit(buf, sizeof(buf), 0, kConsumer));
  q.drain();
  EXPECT_EQ(rt.counters().flag_writes, 2u);
  EXPECT_EQ(q.counters().failed, 1u);
  auto error = q.take_error();
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("failed"), std::string::npos) << *error;
  EXPECT_FALSE(q.take_error().has_value());
}

TEST(PrefetchQueue, WithoutStreamFlagsTheCallerPrefetchesItself) {
  HostRuntime rt;
  rt.disable_flags();
  PrefetchQueue q(rt, {});
  char buf[64];
  EXPECT_FALSE(q.submit(buf, sizeof(buf), 0, kConsumer));
  EXPECT_EQ(rt.counters().prefetches, 0u);
}

TEST(PrefetchQueue, StopIssuesEverythingQueuedThenRefuses) {
  HostRuntime rt;
  PrefetchQueue q(rt, {});
  rt.hold_prefetches(true);
  char buf[64];
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(q.submit(buf, sizeof(buf), 0, kConsumer));
  rt.hold_prefetches(false);
  q.stop();
  EXPECT_EQ(q.counters().issued, 5u);
  EXPECT_EQ(rt.counters().flag_writes, 5u);
  EXPECT_FALSE(q.submit(buf, sizeof(buf), 0, kConsumer));
}

TEST(PrefetchQueue, AConsumerStreamIsRejected) {
  HostRuntime rt;
  PrefetchQueue q(rt, {});
  char buf[64];
  EXPECT_THROW(q.submit(buf, sizeof(buf), 0, kHostStream), InvalidArgument);
}

#ifdef TORCH_UVM_TEST_CUDA
bool have_gpu() {
  int n = 0;
  bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

// The mechanism itself on the real driver: a stream waiting on a flag is held
// until the flag reaches the value, then runs.
TEST(PrefetchQueueCuda, AStreamWaitsForItsFlag) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  GpuRuntime rt;
  FlagHandle flag = rt.create_flag();
  ASSERT_NE(flag, nullptr);
  StreamRef s = rt.create_stream(0);
  rt.stream_wait_flag(s, flag, 1);
  auto native = reinterpret_cast<cudaStream_t>(s.handle);
  EXPECT_EQ(cudaStreamQuery(native), cudaErrorNotReady);  // held
  (void)cudaGetLastError();
  __atomic_store_n(flag, 1u, __ATOMIC_SEQ_CST);
  EXPECT_EQ(cudaStreamSynchronize(native), cudaSuccess);  // released
  rt.destroy_stream(s);
  rt.destroy_flag(flag);
}

// On the GPU: with the worker's prefetch held back 300 ms, an event recorded
// on the consumer stream right after the submit stays incomplete, and once
// the consumer is done the pages' last prefetch went to the GPU.
TEST(PrefetchQueueCuda, TheConsumerKernelWaitsForTheWorkersPrefetch) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  auto gpu = std::make_shared<GpuRuntime>();
  FaultyRuntime rt(gpu);
  rt.before(FaultyRuntime::kPrefetch,
            [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  constexpr std::size_t kBytes = 64 * kMiB;
  void* p = gpu->allocate_managed(kBytes);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBytes);  // host-resident
  StreamRef consumer = gpu->create_stream(0);
  auto native = reinterpret_cast<cudaStream_t>(consumer.handle);
  PrefetchQueue q(rt, {});
  ASSERT_TRUE(q.submit(p, kBytes, 0, consumer));
  cudaEvent_t after = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(after, native), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady) << "the consumer did not wait";
  (void)cudaGetLastError();
  ASSERT_EQ(cudaStreamSynchronize(native), cudaSuccess);
  int location = -7;
  ASSERT_EQ(cudaMemRangeGetAttribute(&location, sizeof(location),
                                     cudaMemRangeAttributeLastPrefetchLocation, p, kBytes),
            cudaSuccess);
  EXPECT_EQ(location, 0);  // read before the queue is drained or destroyed
  q.drain();
  cudaEventDestroy(after);
  gpu->destroy_stream(consumer);
  gpu->free_managed(p);
}

// End to end: the consumer stream is done only after the pages moved.
TEST(PrefetchQueueCuda, ConsumerRunsAfterThePagesMoved) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  GpuRuntime rt;
  constexpr std::size_t kBytes = 64 * kMiB;
  void* p = rt.allocate_managed(kBytes);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBytes);  // host-resident
  StreamRef consumer = rt.create_stream(0);
  {
    PrefetchQueue q(rt, {/*chunk_bytes=*/16 * kMiB});
    ASSERT_TRUE(q.submit(p, kBytes, 0, consumer));
    rt.synchronize_stream(consumer);  // returns: the flag was released
    EXPECT_EQ(q.counters().issued, 1u);
    EXPECT_FALSE(q.take_error().has_value());
  }
  int type = -1, id = -1;
  ASSERT_EQ(cudaMemRangeGetAttribute(&type, sizeof(type),
                                     cudaMemRangeAttributeLastPrefetchLocationType, p, kBytes),
            cudaSuccess);
  ASSERT_EQ(cudaMemRangeGetAttribute(&id, sizeof(id),
                                     cudaMemRangeAttributeLastPrefetchLocationId, p, kBytes),
            cudaSuccess);
  EXPECT_EQ(type, cudaMemLocationTypeDevice);
  EXPECT_EQ(id, 0);
  rt.destroy_stream(consumer);
  rt.free_managed(p);
}

// PyTorch's default stream is the legacy one, and cudaFree synchronizes the
// device while holding the driver's memory locks: with a stream waiting on the
// worker, the allocator must let the worker issue everything before freeing a
// segment, or each waits for the other.
TEST(PrefetchQueueCuda, ReleasingSegmentsWhileTheLegacyStreamWaitsDoesNotDeadlock) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  auto rt = std::make_shared<GpuRuntime>();
  CachingManagedAllocator a(rt);
  PrefetchQueue q(*rt, {});
  a.set_release_hooks([&q] { q.pause(); }, [&q] { q.resume(); });
  constexpr std::size_t kBytes = 256 * kMiB;
  void* data = a.allocate(kBytes, kCpuDevice, kHostStream);
  std::memset(data, 1, kBytes);
  a.free(a.allocate(64 * kMiB, 0, StreamRef{0, 0}));  // a free segment to release
  const StreamRef legacy{0, 0};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(q.submit(data, kBytes, i % 2 == 0 ? 0 : kCpuDevice, legacy));
  }
  a.empty_cache();  // cudaFree while the legacy stream waits
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(q.counters().issued, 4u);
  a.free(data);
}
#endif

}  // namespace
}  // namespace torch_uvm
