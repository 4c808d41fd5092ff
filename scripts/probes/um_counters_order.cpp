// Which managed memory the driver's unified-memory counters see, depending on
// when counting first began (tests/results/README.md, session 11). On the GPU
// machine, from the repository root:
//   /usr/bin/g++ -O2 -std=c++17 -DTORCH_UVM_WITH_CUPTI scripts/probes/um_counters_order.cpp \
//       csrc/runtime/gpu_runtime.cpp csrc/runtime/um_counters.cpp csrc/core/*.cpp -Icsrc \
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -ldl -lpthread -o /tmp/probe
//   for o in after context first restart; do /tmp/probe $o; done
// after: allocate (the first CUDA call), then start counting; context: make
// the context, start, allocate; first: start before anything; restart:
// start and stop, then as "after".
#include <cuda_runtime_api.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include "runtime/gpu_runtime.h"
#include "runtime/um_counters.h"
using namespace torch_uvm;
int main(int argc, char** argv) {
  std::string order = argc > 1 ? argv[1] : "after";
  constexpr std::size_t n = 16u << 20;
  auto t0 = std::chrono::steady_clock::now();
  if (order == "first" || order == "restart") std::printf("start: '%s'\n", UmCounters::start().c_str());
  std::printf("start took %.0f ms\n", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  if (order == "restart") { UmRecording e = UmCounters::stop(); std::printf("empty stop: %zu\n", e.events.size()); }
  cudaFree(nullptr);
  if (order == "context") std::printf("start: '%s'\n", UmCounters::start().c_str());
  GpuRuntime rt;
  void* p = rt.allocate_managed(n);
  std::memset(p, 1, n);
  if (order == "after" || order == "restart") std::printf("start: '%s'\n", UmCounters::start().c_str());
  rt.prefetch(p, n, 0, StreamRef{0, 0});
  cudaDeviceSynchronize();
  std::memset(p, 2, n);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  UmRecording r = UmCounters::stop();
  std::printf("%s: events %zu dropped %llu buffers %llu other %llu missing '%s'\n", order.c_str(),
              r.events.size(), (unsigned long long)r.dropped, (unsigned long long)r.buffers,
              (unsigned long long)r.other, r.missing.c_str());
  std::size_t counts[8] = {};
  std::size_t bytes[8] = {};
  for (const UmEvent& e : r.events) { counts[e.kind]++; if (e.counts_bytes()) bytes[e.kind] += e.value; }
  for (int k = 0; k < 8; ++k) if (counts[k]) std::printf("  %s: %zu events, %zu bytes\n", kind_name(UmEvent::Kind(k)), counts[k], bytes[k]);
  std::size_t shown = 0;
  for (const UmEvent& e : r.events) {
    if (e.kind != UmEvent::kCpuFault && shown++ < 4) std::printf("  %s %s addr %p value %llu dev %d\n", kind_name(e.kind),
                                  cause_name(e.cause), (void*)e.address,
                                  (unsigned long long)e.value, (int)e.device);
  }
  return 0;
}
