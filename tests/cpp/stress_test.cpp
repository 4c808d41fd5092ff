// A randomized sequence of allocate / free / record_stream / empty_cache from
// several threads. After every step: the allocator's structural invariants
// hold (blocks tile their segments, nothing overlaps, pools and maps agree),
// its statistics match the blocks, every counter is self-consistent, and each
// live allocation still holds the bytes its owner wrote (so no two live
// blocks overlap in practice either).
//
// TORCH_UVM_STRESS_OPS sets the total operations (default 1,000,000);
// TORCH_UVM_STRESS_CHECK_EVERY checks every N-th step (default 1).
#include <atomic>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "core/errors.h"
#include "runtime/faulty_runtime.h"
#include "runtimes.h"

namespace torch_uvm::test {
namespace {

std::size_t env_or(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

struct Live {
  unsigned char* ptr;
  std::size_t size;
  uint64_t tag;
};

void write_tag(const Live& l) {
  std::memcpy(l.ptr, &l.tag, sizeof(l.tag));
  std::memcpy(l.ptr + l.size - sizeof(l.tag), &l.tag, sizeof(l.tag));
}

bool tag_intact(const Live& l) {
  uint64_t head, tail;
  std::memcpy(&head, l.ptr, sizeof(head));
  std::memcpy(&tail, l.ptr + l.size - sizeof(tail), sizeof(tail));
  return head == l.tag && tail == l.tag;
}

void check_counters(const MemoryStats& s) {
  for (const StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                             &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                             &s.inactive_split_bytes, &s.requested_bytes}) {
    for (const Stat& st : a->pools) {
      ASSERT_EQ(st.allocated - st.freed, st.current);
      ASSERT_GE(st.peak, st.current);
      ASSERT_GE(st.current, 0);
    }
  }
  ASSERT_LE(s.allocated_bytes.all().current, s.active_bytes.all().current);
  ASSERT_LE(s.active_bytes.all().current + s.inactive_split_bytes.all().current,
            s.reserved_bytes.all().current);
  ASSERT_LE(s.reserved_bytes.all().current, s.cap_bytes);
}


// One thread's share of the randomized operations: allocate (45%), free
// (45%, checking the owner's bytes first), record_stream (7%), finish the
// streams' work (2%), empty_cache (1 in empty_cache_odds of the rest).
// Allocator exceptions propagate: each test says which it expects.
struct RandomOps {
  CachingManagedAllocator& a;
  std::vector<StreamRef> streams;
  std::function<void()> finish_work;
  unsigned empty_cache_odds;
  std::mt19937_64 rng;
  std::vector<Live> live;
  std::uniform_real_distribution<double> log_size{0.0, 25.0};  // 1 B .. 32 MiB

  // False if a live allocation was found overwritten.
  bool step() {
    unsigned op = rng() % 100;
    if (op < 45 || live.empty()) {
      std::size_t size = std::max<std::size_t>(16, std::size_t(std::exp2(log_size(rng))));
      DeviceIndex home = (rng() % 4 == 0) ? kCpuDevice : 0;
      StreamRef stream = home == kCpuDevice ? kHostStream : streams[rng() % streams.size()];
      auto* p = static_cast<unsigned char*>(a.allocate(size, home, stream));
      Live l{p, size, rng()};
      write_tag(l);
      live.push_back(l);
    } else if (op < 90) {
      std::size_t i = rng() % live.size();
      bool intact = tag_intact(live[i]);
      a.free(live[i].ptr);
      live[i] = live.back();
      live.pop_back();
      return intact;
    } else if (op < 97) {
      a.record_stream(live[rng() % live.size()].ptr, streams[rng() % streams.size()]);
    } else if (op < 99) {
      finish_work();
    } else if (rng() % empty_cache_odds == 0) {
      a.empty_cache();
    }
    return true;
  }

  // Invariants and counters; false (with a failure added) if broken.
  bool check(int id, std::size_t step_index) {
    try {
      a.check_invariants();
    } catch (const std::logic_error& e) {
      ADD_FAILURE() << "step " << step_index << " of thread " << id << ": " << e.what();
      return false;
    }
    check_counters(a.stats());
    return true;
  }

  void free_all() {
    for (const Live& l : live) {
      if (!tag_intact(l)) ADD_FAILURE() << "a live allocation was overwritten";
      a.free(l.ptr);
    }
    live.clear();
  }
};

using StressTest = AllocatorTest;

TEST_P(StressTest, RandomizedOperationsFromSeveralThreadsKeepEveryInvariant) {
  const std::size_t total_ops = env_or("TORCH_UVM_STRESS_OPS", 1000000);
  const std::size_t check_every = std::max<std::size_t>(1, env_or("TORCH_UVM_STRESS_CHECK_EVERY", 1));
  constexpr int kThreads = 4;
  alloc().set_cap(256 * kMiB);
  auto streams = GetParam().streams(3);
  const bool host = GetParam().name == "host";
  if (host) static_cast<HostRuntime&>(*runtime_).set_auto_complete_events(false);
  std::atomic<std::size_t> ooms{0}, ops_done{0};
  std::atomic<bool> failed{false};

  auto worker = [&](int id) {
    RandomOps ops{alloc(), streams, [&] { GetParam().finish_work(*runtime_); }, 50,
                  std::mt19937_64(1234 + id), {}};
    const std::size_t my_ops = total_ops / kThreads;
    for (std::size_t step = 0; step < my_ops && !failed; ++step) {
      try {
        if (!ops.step()) {
          failed = true;
          ADD_FAILURE() << "a live allocation was overwritten";
        }
      } catch (const OutOfMemoryError&) {
        ++ooms;
      }
      if (step % check_every == 0 && !ops.check(id, step)) failed = true;
    }
    ops.free_all();
    ops_done += my_ops;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();

  GetParam().finish_work(*runtime_);
  alloc().empty_cache();
  alloc().check_invariants();
  auto s = alloc().stats();
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.active_bytes.all().current, 0);
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
  EXPECT_GT(s.allocation.all().allocated, int64_t(total_ops / 4));
  std::printf("[ stress   ] %zu ops on %s, %lld allocations, %zu OOMs, peak reserved %s\n",
              ops_done.load(), GetParam().name.c_str(),
              static_cast<long long>(s.allocation.all().allocated), ooms.load(),
              format_bytes(static_cast<std::size_t>(s.reserved_bytes.all().peak)).c_str());
}

// The same operations with every runtime call failing now and then (1 in
// 100): whatever fails, nothing leaks, nothing is counted twice, no block is
// reused while fenced, and the statistics agree with the blocks after every
// step. TORCH_UVM_FAULT_OPS sets the total (default 200,000).
TEST_P(StressTest, RandomFailuresOfEveryRuntimeCallKeepEveryInvariant) {
  const std::size_t total_ops = env_or("TORCH_UVM_FAULT_OPS", 200000);
  const std::size_t check_every = std::max<std::size_t>(1, env_or("TORCH_UVM_STRESS_CHECK_EVERY", 1));
  constexpr int kThreads = 4;
  auto inner = GetParam().make();
  auto faulty = std::make_shared<FaultyRuntime>(inner);
  allocator_.reset();
  runtime_ = faulty;
  allocator_ = std::make_unique<CachingManagedAllocator>(runtime_);
  alloc().set_cap(256 * kMiB);
  auto streams = GetParam().streams(3);
  const bool host = GetParam().name == "host";
  if (host) static_cast<HostRuntime&>(*inner).set_auto_complete_events(false);
  faulty->fail_randomly(0.01, ~0u, 99);
  std::atomic<std::size_t> errors{0};
  std::atomic<bool> failed{false};

  auto worker = [&](int id) {
    RandomOps ops{alloc(), streams, [&] { GetParam().finish_work(*inner); }, 1,
                  std::mt19937_64(777 + id), {}};
    for (std::size_t step = 0; step < total_ops / kThreads && !failed; ++step) {
      try {
        if (!ops.step()) {
          failed = true;
          ADD_FAILURE() << "a live allocation was overwritten";
        }
      } catch (const OutOfMemoryError&) {
        ++errors;
      } catch (const RuntimeError&) {
        ++errors;  // an injected driver failure, reported to the caller
      }
      if (step % check_every == 0 && !ops.check(id, step)) failed = true;
    }
    ops.free_all();
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();

  faulty->stop_failing();
  GetParam().finish_work(*inner);
  alloc().empty_cache();
  alloc().check_invariants();
  auto s = alloc().stats();
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.active_bytes.all().current, 0) << "a block was lost to a failure";
  EXPECT_EQ(s.reserved_bytes.all().current, 0) << "a segment was lost to a failure";
  if (host) {
    EXPECT_EQ(static_cast<HostRuntime&>(*inner).bytes_in_use(), 0u);
  }
  EXPECT_GT(faulty->injected(), 100u);
  std::printf("[ faults   ] %zu ops on %s, %zu failures injected, %zu errors reported\n",
              total_ops, GetParam().name.c_str(), faulty->injected(), errors.load());
}

INSTANTIATE_TEST_SUITE_P(Runtimes, StressTest, testing::ValuesIn(runtime_kinds()), kind_name);

}  // namespace
}  // namespace torch_uvm::test
