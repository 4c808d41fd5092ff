// Vocabulary shared by the policy and the runtimes: where memory lives and which
// stream orders its use. Nothing here depends on CUDA, HIP or torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace torch_uvm {

// A processor that managed memory can live on or be used from.
// -1 is the CPU (the same value as cudaCpuDeviceId); 0..N-1 are GPUs.
using DeviceIndex = int;
constexpr DeviceIndex kCpuDevice = -1;

// A stream is a runtime handle (cudaStream_t / hipStream_t bit pattern) plus the
// device it belongs to: the null stream 0 exists once per device, so the handle
// alone does not name a stream. CPU work is ordered on {kCpuDevice, 0}.
struct StreamRef {
  DeviceIndex device = kCpuDevice;
  std::uintptr_t handle = 0;

  bool operator==(const StreamRef& o) const {
    return device == o.device && handle == o.handle;
  }
  bool operator!=(const StreamRef& o) const { return !(*this == o); }
  bool operator<(const StreamRef& o) const {
    return device != o.device ? device < o.device : handle < o.handle;
  }
};

constexpr StreamRef kHostStream{kCpuDevice, 0};

// A private memory pool (PyTorch's MempoolId_t): blocks allocated to one are
// reused only within it, as CUDA graphs need. {0, 0} is the ordinary pool.
using PoolId = std::pair<std::uint64_t, std::uint64_t>;
constexpr PoolId kDefaultPool{0, 0};

// What a copy's driver call is told about its pointers. kAny lets the
// driver look (cudaMemcpyDefault); kDeviceToDevice says both are read and
// written on a GPU. A managed range whose preferred location is the CPU is
// copied by the driver like host memory under kAny: 3 GB/s after it was
// prefetched to the GPU, against HBM speed as device to device (measured on
// an H100, benchmarks/results/2026-11-23-h100/run-before-copykind-fix.md).
enum class CopyKind { kAny, kDeviceToDevice };

// The hints of cudaMemAdvise / hipMemAdvise.
enum class Advice {
  kSetReadMostly,
  kUnsetReadMostly,
  kSetPreferredLocation,
  kUnsetPreferredLocation,
  kSetAccessedBy,
  kUnsetAccessedBy,
};

// An opaque event owned by a Runtime.
using EventHandle = void*;

// A 32-bit word in host memory that GPU streams can wait on and write
// (stream memory operations), and the host can write: how a stream is held
// until a worker thread has issued work for it. Owned by a Runtime.
using FlagHandle = std::uint32_t*;

struct DeviceMemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

std::string device_name(DeviceIndex device);  // "cpu", "cuda:0"
std::string advice_name(Advice advice);

}  // namespace torch_uvm
