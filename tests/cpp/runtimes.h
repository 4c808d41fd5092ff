// The runtimes the shared suites run over: the host runtime always, and the
// CUDA runtime when the test binary is built with TORCH_UVM_TEST_CUDA and a GPU
// is present. A suite written once against the Runtime interface thus checks
// the policy in CI and the real driver on the GPU machine.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/caching_managed_allocator.h"
#include "core/runtime.h"
#include "runtime/host_runtime.h"

#ifdef TORCH_UVM_TEST_CUDA
#include <cuda_runtime_api.h>

#include "runtime/gpu_runtime.h"
#endif

namespace torch_uvm::test {

struct RuntimeKind {
  std::string name;
  std::function<std::shared_ptr<Runtime>()> make;
  // Distinct streams on device 0 (real ones for CUDA).
  std::function<std::vector<StreamRef>(int n)> streams;
  // Makes every recorded event complete (waits for the streams on CUDA).
  std::function<void(Runtime&)> finish_work;
};

inline std::vector<RuntimeKind> runtime_kinds() {
  std::vector<RuntimeKind> kinds;
  kinds.push_back({"host",
                   [] { return std::make_shared<HostRuntime>(2, 1ull << 30); },
                   [](int n) {
                     std::vector<StreamRef> s;
                     for (int i = 0; i < n; ++i) s.push_back({0, 0x1000u + i});
                     return s;
                   },
                   [](Runtime& rt) { static_cast<HostRuntime&>(rt).complete_events(); }});
#ifdef TORCH_UVM_TEST_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    kinds.push_back({"cuda", [] { return std::make_shared<GpuRuntime>(); },
                     [](int n) {
                       std::vector<StreamRef> s;
                       for (int i = 0; i < n; ++i) {
                         cudaStream_t stream = nullptr;
                         cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
                         s.push_back({0, reinterpret_cast<std::uintptr_t>(stream)});
                       }
                       return s;  // leaked on purpose: tests are short-lived
                     },
                     [](Runtime&) { cudaDeviceSynchronize(); }});
  } else {
    (void)cudaGetLastError();
  }
#endif
  return kinds;
}

inline std::string kind_name(const testing::TestParamInfo<RuntimeKind>& info) {
  return info.param.name;
}

// A fixture holding one allocator over the runtime under test.
class AllocatorTest : public testing::TestWithParam<RuntimeKind> {
 protected:
  void make(AllocatorConfig config = {}) {
    allocator_.reset();
    runtime_ = GetParam().make();
    allocator_ = std::make_unique<CachingManagedAllocator>(runtime_, config);
  }
  void SetUp() override { make(); }
  void TearDown() override {
    if (allocator_) allocator_->check_invariants();
  }
  CachingManagedAllocator& alloc() { return *allocator_; }
  int64_t stat(const std::string& key) const {
    for (const auto& [k, v] : flatten(allocator_->stats())) {
      if (k == key) return v;
    }
    ADD_FAILURE() << "no statistic " << key;
    return -1;
  }

  std::shared_ptr<Runtime> runtime_;
  std::unique_ptr<CachingManagedAllocator> allocator_;
};

constexpr std::size_t kKiB = 1024, kMiB = 1024 * 1024;

}  // namespace torch_uvm::test
