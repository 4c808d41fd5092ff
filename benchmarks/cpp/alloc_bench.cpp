// Allocation cost from C++: the median time of an alloc + free pair, per size,
// for one allocator (a process can install only one CUDA allocator).
//
//   alloc_bench MODE    -> one JSON line: {"mode": MODE, "result": {"<bytes>": us}}
//
//   torch             c10's CUDACachingAllocator (raw_alloc / raw_delete)
//   torch_uvm         the same calls after torch_uvm::enable(): through
//                     CUDAPluggableAllocator into the CachingManagedAllocator
//   torch_uvm_direct  torch_uvm::raw_alloc / raw_free (no pluggable layer)
//   raw_managed       cudaMallocManaged + cudaFree for every pair
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <torch_uvm/torch_uvm.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Median over `rounds` of the mean time of `batch` pairs, in microseconds.
double median_us(const std::function<void()>& pair, int rounds, int batch) {
  for (int i = 0; i < batch; ++i) pair();  // warm the cache
  std::vector<double> samples;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) pair();
    auto t1 = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> release;
  const at::Device gpu(at::kCUDA, 0);
  if (mode == "torch" || mode == "torch_uvm") {
    if (mode == "torch_uvm") torch_uvm::enable();
    at::empty({1}, at::TensorOptions().device(at::kCUDA));  // initializes the allocator
    alloc = [](size_t n) { return c10::cuda::CUDACachingAllocator::raw_alloc(n); };
    release = [](void* p) { c10::cuda::CUDACachingAllocator::raw_delete(p); };
  } else if (mode == "torch_uvm_direct") {
    alloc = [gpu](size_t n) { return torch_uvm::raw_alloc(n, gpu); };
    release = [](void* p) { torch_uvm::raw_free(p); };
  } else if (mode == "raw_managed") {
    alloc = [](size_t n) {
      void* p = nullptr;
      if (cudaMallocManaged(&p, n) != cudaSuccess) throw std::runtime_error("cudaMallocManaged");
      return p;
    };
    release = [](void* p) { cudaFree(p); };
  } else {
    std::fprintf(stderr, "usage: alloc_bench torch|torch_uvm|torch_uvm_direct|raw_managed\n");
    return 2;
  }
  const size_t sizes[] = {512, 4096, 1u << 20, 64u << 20, 256u << 20};
  std::printf("{\"mode\": \"%s\", \"result\": {", mode.c_str());
  bool first = true;
  for (size_t n : sizes) {
    const bool slow = mode == "raw_managed";
    double us = median_us([&] { release(alloc(n)); }, 51, slow ? 20 : 200);
    std::printf("%s\"%zu\": %.4f", first ? "" : ", ", n, us);
    first = false;
  }
  std::printf("}}\n");
  return 0;
}
