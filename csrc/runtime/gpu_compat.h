// The one place that hides the differences between CUDA 12, CUDA 13 and HIP.
// gpu_runtime.cpp speaks only the gpu* names below.
//  - CUDA 13 removed the int-device forms of cudaMemAdvise and
//    cudaMemPrefetchAsync: they take a cudaMemLocation (and prefetch a flags
//    argument). CUDA 12 has both; HIP has only the int forms.
//  - The CPU is device -1 (cudaCpuDeviceId / hipCpuDeviceId) in the int forms
//    and a cudaMemLocationTypeHost location in the new ones.
//  - Stream memory operations (a stream waits on / writes a 32-bit word) are
//    runtime calls in HIP but driver calls in CUDA, reached here through the
//    runtime's driver entry points so that nothing links libcuda. CUDA 12.5
//    added cudaGetDriverEntryPointByVersion; CUDA 13 removed the old form.
#pragma once

#include <cstdint>

#if defined(TORCH_UVM_USE_HIP)
#include <hip/hip_runtime_api.h>

using gpuError_t = hipError_t;
using gpuStream_t = hipStream_t;
using gpuEvent_t = hipEvent_t;
using gpuMemoryAdvise = hipMemoryAdvise;
constexpr gpuError_t gpuSuccess = hipSuccess;
constexpr gpuError_t gpuErrorNotReady = hipErrorNotReady;
constexpr gpuError_t gpuErrorMemoryAllocation = hipErrorOutOfMemory;
constexpr int gpuCpuDeviceId = hipCpuDeviceId;
#define TORCH_UVM_GPU_API_NAME "HIP"
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuMallocManaged(p, n) hipMallocManaged((p), (n), hipMemAttachGlobal)
#define gpuFree hipFree
#define gpuHostAllocMappedPortable(p, n) hipHostMalloc((p), (n), hipHostMallocMapped | hipHostMallocPortable)
#define gpuFreeHost hipHostFree
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventQuery hipEventQuery
#define gpuEventSynchronize hipEventSynchronize
#define gpuStreamWaitEvent(s, e) hipStreamWaitEvent((s), (e), 0)
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDevice hipGetDevice
#define gpuSetDevice hipSetDevice
#define gpuMemGetInfo hipMemGetInfo
#define gpuMemAdviseSetReadMostly hipMemAdviseSetReadMostly
#define gpuMemAdviseUnsetReadMostly hipMemAdviseUnsetReadMostly
#define gpuMemAdviseSetPreferredLocation hipMemAdviseSetPreferredLocation
#define gpuMemAdviseUnsetPreferredLocation hipMemAdviseUnsetPreferredLocation
#define gpuMemAdviseSetAccessedBy hipMemAdviseSetAccessedBy
#define gpuMemAdviseUnsetAccessedBy hipMemAdviseUnsetAccessedBy

inline gpuError_t gpuMemAdviseTo(const void* p, size_t n, gpuMemoryAdvise a,
                                 int device) {
  return hipMemAdvise(p, n, a, device);
}
inline gpuError_t gpuMemPrefetchTo(const void* p, size_t n, int device,
                                   gpuStream_t s) {
  return hipMemPrefetchAsync(p, n, device, s);
}
#define gpuStreamCreateNonBlocking(s) hipStreamCreateWithFlags((s), hipStreamNonBlocking)
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuHostAllocFlag(p, n) \
  hipHostMalloc((p), (n), hipHostMallocMapped | hipHostMallocPortable)
#define gpuFreeHost hipHostFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuDeviceEnablePeerAccess(peer) hipDeviceEnablePeerAccess((peer), 0)
constexpr gpuError_t gpuErrorPeerAccessAlreadyEnabled = hipErrorPeerAccessAlreadyEnabled;
#define gpuDeviceCanAccessPeer hipDeviceCanAccessPeer
using gpuStreamCaptureMode = hipStreamCaptureMode;
constexpr gpuStreamCaptureMode gpuStreamCaptureModeRelaxed = hipStreamCaptureModeRelaxed;
#define gpuThreadExchangeStreamCaptureMode hipThreadExchangeStreamCaptureMode
// hipStreamGetDevice is missing from the HIP releases Debian ships: the
// caller's fallback stands.
inline bool gpuStreamDeviceOf(gpuStream_t, int*) { return false; }
inline bool gpuStreamMemOpsAvailable() { return true; }
// HIP compares plainly (flag >= value); 2^32 moves before it wraps.
inline gpuError_t gpuStreamWaitValue32(gpuStream_t s, uint32_t* flag, uint32_t value) {
  return hipStreamWaitValue32(s, flag, value, hipStreamWaitValueGte, 0xFFFFFFFFu);
}
inline gpuError_t gpuStreamWriteValue32(gpuStream_t s, uint32_t* flag, uint32_t value) {
  return hipStreamWriteValue32(s, flag, value, 0);
}

#else
#include <cuda.h>  // driver types for the stream memory operations; no libcuda link
#include <cuda_runtime_api.h>

using gpuError_t = cudaError_t;
using gpuStream_t = cudaStream_t;
using gpuEvent_t = cudaEvent_t;
using gpuMemoryAdvise = cudaMemoryAdvise;
constexpr gpuError_t gpuSuccess = cudaSuccess;
constexpr gpuError_t gpuErrorNotReady = cudaErrorNotReady;
constexpr gpuError_t gpuErrorMemoryAllocation = cudaErrorMemoryAllocation;
constexpr int gpuCpuDeviceId = cudaCpuDeviceId;
#define TORCH_UVM_GPU_API_NAME "CUDA"
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuMallocManaged(p, n) cudaMallocManaged((p), (n), cudaMemAttachGlobal)
#define gpuFree cudaFree
#define gpuHostAllocMappedPortable(p, n) cudaHostAlloc((p), (n), cudaHostAllocMapped | cudaHostAllocPortable)
#define gpuFreeHost cudaFreeHost
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventQuery cudaEventQuery
#define gpuEventSynchronize cudaEventSynchronize
#define gpuStreamWaitEvent(s, e) cudaStreamWaitEvent((s), (e), 0)
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDevice cudaGetDevice
#define gpuSetDevice cudaSetDevice
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMemAdviseSetReadMostly cudaMemAdviseSetReadMostly
#define gpuMemAdviseUnsetReadMostly cudaMemAdviseUnsetReadMostly
#define gpuMemAdviseSetPreferredLocation cudaMemAdviseSetPreferredLocation
#define gpuMemAdviseUnsetPreferredLocation cudaMemAdviseUnsetPreferredLocation
#define gpuMemAdviseSetAccessedBy cudaMemAdviseSetAccessedBy
#define gpuMemAdviseUnsetAccessedBy cudaMemAdviseUnsetAccessedBy

#if CUDART_VERSION >= 13000
inline cudaMemLocation gpuLocation(int device) {
  cudaMemLocation loc{};
  if (device == cudaCpuDeviceId) {
    loc.type = cudaMemLocationTypeHost;
    loc.id = 0;
  } else {
    loc.type = cudaMemLocationTypeDevice;
    loc.id = device;
  }
  return loc;
}
inline gpuError_t gpuMemAdviseTo(const void* p, size_t n, gpuMemoryAdvise a,
                                 int device) {
  return cudaMemAdvise(p, n, a, gpuLocation(device));
}
inline gpuError_t gpuMemPrefetchTo(const void* p, size_t n, int device,
                                   gpuStream_t s) {
  return cudaMemPrefetchAsync(p, n, gpuLocation(device), 0, s);
}
#else
inline gpuError_t gpuMemAdviseTo(const void* p, size_t n, gpuMemoryAdvise a,
                                 int device) {
  return cudaMemAdvise(p, n, a, device);
}
inline gpuError_t gpuMemPrefetchTo(const void* p, size_t n, int device,
                                   gpuStream_t s) {
  return cudaMemPrefetchAsync(p, n, device, s);
}
#endif

#define gpuStreamCreateNonBlocking(s) cudaStreamCreateWithFlags((s), cudaStreamNonBlocking)
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuHostAllocFlag(p, n) \
  cudaHostAlloc((p), (n), cudaHostAllocMapped | cudaHostAllocPortable)
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuDeviceEnablePeerAccess(peer) cudaDeviceEnablePeerAccess((peer), 0)
constexpr gpuError_t gpuErrorPeerAccessAlreadyEnabled = cudaErrorPeerAccessAlreadyEnabled;
#define gpuDeviceCanAccessPeer cudaDeviceCanAccessPeer
using gpuStreamCaptureMode = cudaStreamCaptureMode;
constexpr gpuStreamCaptureMode gpuStreamCaptureModeRelaxed = cudaStreamCaptureModeRelaxed;
#define gpuThreadExchangeStreamCaptureMode cudaThreadExchangeStreamCaptureMode
// cudaStreamGetDevice arrived in CUDA 12.8; before it a stream's device is
// not known to the runtime, and the caller's fallback stands.
inline bool gpuStreamDeviceOf(gpuStream_t s, int* device) {
#if CUDART_VERSION >= 12080
  return cudaStreamGetDevice(s, device) == cudaSuccess;
#else
  (void)s;
  (void)device;
  return false;
#endif
}

using gpuStreamValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

inline gpuStreamValueFn gpuDriverEntry(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status);
#else
  cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &status);
#endif
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<gpuStreamValueFn>(fn);
}
inline gpuStreamValueFn gpuWaitValueFn() {
  static gpuStreamValueFn fn = gpuDriverEntry("cuStreamWaitValue32");
  return fn;
}
inline gpuStreamValueFn gpuWriteValueFn() {
  static gpuStreamValueFn fn = gpuDriverEntry("cuStreamWriteValue32");
  return fn;
}
inline bool gpuStreamMemOpsAvailable() {
  return gpuWaitValueFn() != nullptr && gpuWriteValueFn() != nullptr;
}
// CUresult and cudaError_t share their values for the errors these return.
inline gpuError_t gpuStreamWaitValue32(gpuStream_t s, uint32_t* flag, uint32_t value) {
  return static_cast<gpuError_t>(gpuWaitValueFn()(
      s, reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WAIT_VALUE_GEQ));
}
inline gpuError_t gpuStreamWriteValue32(gpuStream_t s, uint32_t* flag, uint32_t value) {
  return static_cast<gpuError_t>(gpuWriteValueFn()(
      s, reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT));
}
#endif
