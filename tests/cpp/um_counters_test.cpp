// The driver's counters: naming what they report by address (core, on any
// machine), and on the GPU, that a prefetch shows as a migration to the GPU
// caused by a prefetch and a CPU write after it as CPU faults that bring the
// pages home (runtime/um_counters.h through CUPTI).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/address_names.h"
#include "core/errors.h"
#include "core/um_event.h"
#include "runtime/um_counters.h"

#ifdef TORCH_UVM_TEST_CUDA
#include <cuda_runtime_api.h>

#include "runtime/gpu_runtime.h"
#endif

namespace torch_uvm {
namespace {

using Pieces = std::vector<std::pair<std::string, std::size_t>>;

Pieces split(const AddressNames& names, std::uintptr_t address, std::size_t bytes) {
  Pieces out;
  names.split(address, bytes, [&](const std::string& n, std::size_t b) { out.push_back({n, b}); });
  return out;
}

TEST(AddressNames, TheFirstNameOfAByteKeepsIt) {
  AddressNames names;
  names.add(1000, 100, "x");            // a tensor
  names.add(900, 400, "layer");         // the submodule around it: only the rest
  names.add(0, 10000, "allocation");    // the allocation around both
  EXPECT_EQ(names.name_at(950), "layer");
  EXPECT_EQ(names.name_at(1000), "x");
  EXPECT_EQ(names.name_at(1099), "x");
  EXPECT_EQ(names.name_at(1100), "layer");
  EXPECT_EQ(names.name_at(1299), "layer");
  EXPECT_EQ(names.name_at(1300), "allocation");
  EXPECT_EQ(names.name_at(10000), "");
  EXPECT_EQ(names.ranges(), 5u);   // allocation | layer | x | layer | allocation
}

TEST(AddressNames, ARangeSplitsAcrossItsNamesAndGaps) {
  AddressNames names;
  names.add(100, 50, "a");
  names.add(200, 50, "b");
  EXPECT_EQ(split(names, 0, 300),
            (Pieces{{"", 100}, {"a", 50}, {"", 50}, {"b", 50}, {"", 50}}));
  EXPECT_EQ(split(names, 120, 10), (Pieces{{"a", 10}}));
  EXPECT_EQ(split(names, 140, 70), (Pieces{{"a", 10}, {"", 50}, {"b", 10}}));
  EXPECT_EQ(split(names, 300, 5), (Pieces{{"", 5}}));
}

TEST(AddressNames, ANameGivenTwiceOrInsideAnotherAddsNothing) {
  AddressNames names;
  names.add(0, 100, "a");
  names.add(10, 20, "b");
  names.add(0, 100, "c");
  EXPECT_EQ(names.ranges(), 1u);
  EXPECT_EQ(split(names, 0, 100), (Pieces{{"a", 100}}));
}

TEST(AddressNames, ARangeRunningPastTheTopOfTheAddressSpaceIsCutThere) {
  AddressNames names;
  const std::uintptr_t top = ~std::uintptr_t{0};
  names.add(top - 100, 1000, "last");
  EXPECT_EQ(names.name_at(top - 1), "last");
  EXPECT_EQ(split(names, top - 200, 1000), (Pieces{{"", 100}, {"last", 100}}));
}

TEST(UmEvent, NamesAndWhatCountsBytes) {
  EXPECT_STREQ(torch_uvm::kind_name(UmEvent::kGpuFault), "gpu_fault");
  EXPECT_STREQ(cause_name(UmEvent::kPrefetch), "prefetch");
  UmEvent e;
  e.kind = UmEvent::kToHost;
  EXPECT_TRUE(e.counts_bytes());
  e.kind = UmEvent::kGpuFault;
  EXPECT_FALSE(e.counts_bytes());
}

// A device without some optional counters: CUPTI refuses a configuration
// that holds any of them. start() drops them from the last until one is
// accepted and names each dropped; the profile warns "this GPU does not
// report: ..." with those names (test_profile.py).
TEST(UmCounters, OptionalCountersADeviceLacksAreDroppedAndNamed) {
  const char* const names[] = {"to_gpu", "to_host", "gpu_fault", "cpu_fault",
                               "thrashing", "throttling", "remote_map", "gpu_to_gpu"};
  std::vector<int> tried;
  auto has_the_first = [&](int kinds) {
    return [&tried, kinds](int n) {
      tried.push_back(n);
      return n <= kinds ? std::string() : "CUPTI_ERROR_NOT_SUPPORTED";
    };
  };
  std::string missing = "left over";
  EXPECT_EQ(configure_dropping_optional(has_the_first(8), 8, 4, names, &missing), "");
  EXPECT_EQ(missing, "");   // a device with all of them: nothing said
  EXPECT_EQ(tried, (std::vector<int>{8}));
  tried.clear();
  EXPECT_EQ(configure_dropping_optional(has_the_first(5), 8, 4, names, &missing), "");
  EXPECT_EQ(missing, "gpu_to_gpu, remote_map, throttling");
  EXPECT_EQ(tried, (std::vector<int>{8, 7, 6, 5}));
  tried.clear();
  EXPECT_EQ(configure_dropping_optional(has_the_first(4), 8, 4, names, &missing), "");
  EXPECT_EQ(missing, "gpu_to_gpu, remote_map, throttling, thrashing");
  tried.clear();
  // Without one of the needed four there is nothing to record: it says why.
  EXPECT_EQ(configure_dropping_optional(has_the_first(3), 8, 4, names, &missing),
            "CUPTI_ERROR_NOT_SUPPORTED");
  EXPECT_EQ(tried, (std::vector<int>{8, 7, 6, 5, 4}));   // never fewer than the needed
}

#ifdef TORCH_UVM_TEST_CUDA
// Sums what the driver reported over [p, p + bytes), per kind and cause.
struct Seen {
  std::size_t prefetched = 0, other_to_gpu = 0, to_host = 0;
  std::size_t gpu_faults = 0, cpu_faults = 0;
};

Seen seen(const UmRecording& r, const void* p, std::size_t bytes) {
  AddressNames names;
  names.add(reinterpret_cast<std::uintptr_t>(p), bytes, "x");
  Seen s;
  for (const UmEvent& e : r.events) {
    std::size_t mine = 0;
    if (e.counts_bytes()) {
      names.split(e.address, e.value, [&](const std::string& n, std::size_t b) {
        if (n == "x") mine += b;
      });
    } else if (names.name_at(e.address) == "x") {
      mine = e.value;
    }
    if (e.kind == UmEvent::kToGpu) (e.cause == UmEvent::kPrefetch ? s.prefetched : s.other_to_gpu) += mine;
    if (e.kind == UmEvent::kToHost) s.to_host += mine;
    if (e.kind == UmEvent::kGpuFault) s.gpu_faults += mine;
    if (e.kind == UmEvent::kCpuFault) s.cpu_faults += mine;
  }
  return s;
}

TEST(UmCountersCuda, APrefetchIsAMigrationToTheGpuAndACpuWriteBringsThePagesHome) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA device";
  }
  GpuRuntime rt;
  if (!rt.concurrent_managed_access(0)) GTEST_SKIP() << "no concurrentManagedAccess";
#ifdef TORCH_UVM_WITH_CUPTI
  // The driver counts only what is allocated after counting first began.
  ASSERT_EQ(UmCounters::arm(), "");
  EXPECT_TRUE(UmCounters::armed());
#endif
  constexpr std::size_t kBytes = 16u << 20;
  void* p = rt.allocate_managed(kBytes);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBytes);   // populated on the host
#ifndef TORCH_UVM_WITH_CUPTI
  GTEST_SKIP() << UmCounters::start();
#endif
  ASSERT_EQ(UmCounters::start(), "") << "the counters must record on the GPU machine";
  EXPECT_TRUE(UmCounters::recording());
  EXPECT_NE(UmCounters::start(), "");   // one recording at a time
  rt.prefetch(p, kBytes, 0, StreamRef{0, 0});
  cudaDeviceSynchronize();
  UmRecording on_gpu = UmCounters::stop();
  EXPECT_FALSE(UmCounters::recording());
  Seen a = seen(on_gpu, p, kBytes);
  EXPECT_EQ(a.prefetched, kBytes);
  EXPECT_EQ(a.gpu_faults, 0u);
  EXPECT_EQ(a.to_host, 0u);

  ASSERT_EQ(UmCounters::start(), "");
  std::memset(p, 2, kBytes);   // the CPU writes the GPU's pages: faults, pages come home
  UmRecording home = UmCounters::stop();
  Seen b = seen(home, p, kBytes);
  EXPECT_GT(b.cpu_faults, 0u);
  EXPECT_EQ(b.to_host, kBytes);
  EXPECT_EQ(b.prefetched, 0u);
  rt.free_managed(p);
  EXPECT_THROW(UmCounters::stop(), InvalidArgument);
}
#endif

}  // namespace
}  // namespace torch_uvm
