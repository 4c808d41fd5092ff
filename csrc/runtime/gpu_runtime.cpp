#include "runtime/gpu_runtime.h"

#include "core/errors.h"
#include "runtime/gpu_compat.h"

namespace torch_uvm {
namespace {

void check(gpuError_t err, const char* call) {
  if (err != gpuSuccess) {
    (void)gpuGetLastError();  // clear the sticky-free error state
    throw RuntimeError(std::string("torch_uvm: ") + call + " failed: " +
                       gpuGetErrorString(err));
  }
}
#define GPU_CHECK(expr) check((expr), #expr)

gpuMemoryAdvise to_native(Advice a) {
  switch (a) {
    case Advice::kSetReadMostly: return gpuMemAdviseSetReadMostly;
    case Advice::kUnsetReadMostly: return gpuMemAdviseUnsetReadMostly;
    case Advice::kSetPreferredLocation: return gpuMemAdviseSetPreferredLocation;
    case Advice::kUnsetPreferredLocation: return gpuMemAdviseUnsetPreferredLocation;
    case Advice::kSetAccessedBy: return gpuMemAdviseSetAccessedBy;
    case Advice::kUnsetAccessedBy: return gpuMemAdviseUnsetAccessedBy;
  }
  throw InvalidArgument("unknown advice");
}

int native_device(DeviceIndex d) { return d == kCpuDevice ? gpuCpuDeviceId : d; }

gpuStream_t native_stream(StreamRef s) {
  return reinterpret_cast<gpuStream_t>(s.handle);
}

// Runs `f` with `device` current, restoring the previous device: events and
// streams belong to a device.
template <typename F>
auto on_device(DeviceIndex device, F f) {
  int previous = 0;
  GPU_CHECK(gpuGetDevice(&previous));
  if (device == kCpuDevice || device == previous) return f();
  GPU_CHECK(gpuSetDevice(device));
  struct Restore {
    int d;
    ~Restore() { (void)gpuSetDevice(d); }
  } restore{previous};
  return f();
}

// New segments may be needed while a CUDA graph is captured (its private
// pool grows). Under the global capture mode such calls are refused, so they
// run in relaxed mode, as PyTorch's allocator does for cudaMalloc.
struct RelaxedCaptureMode {
  gpuStreamCaptureMode saved = gpuStreamCaptureModeRelaxed;
  RelaxedCaptureMode() { (void)gpuThreadExchangeStreamCaptureMode(&saved); }
  ~RelaxedCaptureMode() { (void)gpuThreadExchangeStreamCaptureMode(&saved); }
};

}  // namespace

std::string GpuRuntime::name() const { return TORCH_UVM_GPU_API_NAME; }

// An allocation's result: nullptr when out of memory (the caller may release
// its cache and retry), else checked.
static void* allocated(gpuError_t err, void* p, const char* call) {
  if (err == gpuErrorMemoryAllocation) {
    (void)gpuGetLastError();
    return nullptr;
  }
  check(err, call);
  return p;
}

void* GpuRuntime::allocate_managed(std::size_t bytes) {
  RelaxedCaptureMode relaxed;
  void* p = nullptr;
  // Called first, and apart: the order in which a call's arguments are
  // evaluated is unspecified, and `p` must be read after the allocation.
  const gpuError_t err = gpuMallocManaged(&p, bytes);
  return allocated(err, p, "gpuMallocManaged");
}

void GpuRuntime::free_managed(void* ptr) { GPU_CHECK(gpuFree(ptr)); }

void* GpuRuntime::allocate_host(std::size_t bytes) {
  RelaxedCaptureMode relaxed;
  void* p = nullptr;
  const gpuError_t err = gpuHostAllocMappedPortable(&p, bytes);   // before `p` is read
  return allocated(err, p, "gpuHostAlloc");
}

void GpuRuntime::free_host(void* ptr) { GPU_CHECK(gpuFreeHost(ptr)); }

void GpuRuntime::advise(const void* ptr, std::size_t bytes, Advice advice,
                        DeviceIndex device) {
  RelaxedCaptureMode relaxed;
  GPU_CHECK(gpuMemAdviseTo(ptr, bytes, to_native(advice), native_device(device)));
}

void GpuRuntime::prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                          StreamRef stream) {
  on_device(stream.device, [&] {
    GPU_CHECK(gpuMemPrefetchTo(ptr, bytes, native_device(target),
                               native_stream(stream)));
    return 0;
  });
}

EventHandle GpuRuntime::create_event(DeviceIndex device) {
  return on_device(device, [] {
    gpuEvent_t e = nullptr;
    GPU_CHECK(gpuEventCreateWithFlags(&e, gpuEventDisableTiming));
    return static_cast<EventHandle>(e);
  });
}

void GpuRuntime::destroy_event(EventHandle event) {
  GPU_CHECK(gpuEventDestroy(static_cast<gpuEvent_t>(event)));
}

void GpuRuntime::record_event(EventHandle event, StreamRef stream) {
  on_device(stream.device, [&] {
    GPU_CHECK(gpuEventRecord(static_cast<gpuEvent_t>(event), native_stream(stream)));
    return 0;
  });
}

bool GpuRuntime::query_event(EventHandle event) {
  gpuError_t err = gpuEventQuery(static_cast<gpuEvent_t>(event));
  if (err == gpuErrorNotReady) {
    (void)gpuGetLastError();
    return false;
  }
  check(err, "gpuEventQuery");
  return true;
}

void GpuRuntime::synchronize_event(EventHandle event) {
  GPU_CHECK(gpuEventSynchronize(static_cast<gpuEvent_t>(event)));
}

void GpuRuntime::stream_wait_event(StreamRef stream, EventHandle event) {
  on_device(stream.device, [&] {
    GPU_CHECK(gpuStreamWaitEvent(native_stream(stream), static_cast<gpuEvent_t>(event)));
    return 0;
  });
}

StreamRef GpuRuntime::create_stream(DeviceIndex device) {
  return on_device(device, [device] {
    gpuStream_t s = nullptr;
    GPU_CHECK(gpuStreamCreateNonBlocking(&s));
    return StreamRef{device, reinterpret_cast<std::uintptr_t>(s)};
  });
}

void GpuRuntime::destroy_stream(StreamRef stream) {
  GPU_CHECK(gpuStreamDestroy(native_stream(stream)));
}

void GpuRuntime::synchronize_stream(StreamRef stream) {
  GPU_CHECK(gpuStreamSynchronize(native_stream(stream)));
}

FlagHandle GpuRuntime::create_flag() {
  if (!gpuStreamMemOpsAvailable()) return nullptr;
  // Pinned, mapped, portable host memory: every GPU's streams reach it, and
  // the host can write it. A cache line each, so flags never share one.
  void* p = nullptr;
  GPU_CHECK(gpuHostAllocFlag(&p, 64));
  auto* flag = static_cast<FlagHandle>(p);
  *flag = 0;
  return flag;
}

void GpuRuntime::destroy_flag(FlagHandle flag) { GPU_CHECK(gpuFreeHost(flag)); }

void GpuRuntime::stream_wait_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) {
  on_device(stream.device, [&] {
    GPU_CHECK(gpuStreamWaitValue32(native_stream(stream), flag, value));
    return 0;
  });
}

void GpuRuntime::stream_write_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) {
  on_device(stream.device, [&] {
    GPU_CHECK(gpuStreamWriteValue32(native_stream(stream), flag, value));
    return 0;
  });
}

void GpuRuntime::copy(void* dst, const void* src, std::size_t bytes, StreamRef stream,
                      bool synchronous, CopyKind kind) {
  on_device(stream.device, [&] {
    GPU_CHECK(gpuMemcpyAsync(dst, src, bytes,
                             kind == CopyKind::kDeviceToDevice ? gpuMemcpyDeviceToDevice
                                                               : gpuMemcpyDefault,
                             native_stream(stream)));
    if (synchronous) GPU_CHECK(gpuStreamSynchronize(native_stream(stream)));
    return 0;
  });
}

void GpuRuntime::enable_peer_access(DeviceIndex device, DeviceIndex peer) {
  int can = 0;
  GPU_CHECK(gpuDeviceCanAccessPeer(&can, device, peer));
  if (!can) return;
  on_device(device, [&] {
    gpuError_t err = gpuDeviceEnablePeerAccess(peer);
    if (err == gpuErrorPeerAccessAlreadyEnabled) {
      (void)gpuGetLastError();
      return 0;
    }
    check(err, "gpuDeviceEnablePeerAccess");
    return 0;
  });
}

DeviceIndex GpuRuntime::stream_device(std::uintptr_t handle, DeviceIndex fallback) {
  int device = 0;
  if (handle != 0 && gpuStreamDeviceOf(reinterpret_cast<gpuStream_t>(handle), &device)) {
    return device;
  }
  (void)gpuGetLastError();
  return fallback;
}

int GpuRuntime::device_count() {
  int n = 0;
  gpuError_t err = gpuGetDeviceCount(&n);
  if (err != gpuSuccess) {
    (void)gpuGetLastError();  // no driver or no device: zero GPUs
    return 0;
  }
  return n;
}

DeviceIndex GpuRuntime::current_device() {
  int d = 0;
  GPU_CHECK(gpuGetDevice(&d));
  return d;
}

DeviceMemoryInfo GpuRuntime::memory_info(DeviceIndex device) {
  return on_device(device, [] {
    std::size_t free_bytes = 0, total = 0;
    GPU_CHECK(gpuMemGetInfo(&free_bytes, &total));
    return DeviceMemoryInfo{free_bytes, total};
  });
}

bool GpuRuntime::concurrent_managed_access(DeviceIndex device) {
#if defined(TORCH_UVM_USE_HIP)
  int v = 0;
  GPU_CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeConcurrentManagedAccess, device));
#else
  int v = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrConcurrentManagedAccess, device));
#endif
  return v != 0;
}

}  // namespace torch_uvm
