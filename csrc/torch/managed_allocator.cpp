#include "torch/managed_allocator.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <c10/core/CPUAllocator.h>

#include <array>
#include <mutex>

#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {

c10::Device with_index(c10::Device d) {
  return d.is_cuda() && !d.has_index() ? c10::Device(c10::kCUDA, c10::cuda::current_device()) : d;
}

DeviceIndex to_index(c10::Device d) { return d.is_cpu() ? kCpuDevice : d.index(); }

StreamRef current_stream_ref(c10::Device device) {
  if (!device.is_cuda()) return kHostStream;
  auto stream = c10::cuda::getCurrentCUDAStream(device.index());
  return {device.index(), reinterpret_cast<std::uintptr_t>(stream.stream())};
}

c10::DataPtr ManagedAllocator::allocate(size_t nbytes) {
  if (device_.is_cpu() && (in_forked_child() || capture_underway())) {
    // No CUDA after fork: DataLoader workers get ordinary memory. During a
    // graph capture, a new managed segment (cudaMallocManaged) would break
    // the capture: the scalars PyTorch wraps in CPU tensors get ordinary
    // memory too.
    return c10::GetDefaultCPUAllocator()->allocate(nbytes);
  }
  auto& a = allocator();
  DeviceIndex home = to_index(device_);
  void* p = translate_errors([&] { return a.allocate(nbytes, home, current_stream_ref(device_)); });
  return {p, p, &ManagedAllocator::free_managed, device_};
}

void ManagedAllocator::free_managed(void* ptr) {
  if (ptr == nullptr || in_forked_child()) return;  // the parent owns it
  auto* a = allocator_if_created();
  if (a == nullptr) return;
  try {
    a->free(ptr);
  } catch (const std::exception& e) {
    // A deleter must not throw; report the bug instead of losing it.
    TORCH_WARN("torch_uvm: ", e.what());
  }
}

ManagedAllocator* ManagedAllocator::for_device(c10::Device device) {
  static std::mutex mutex;
  static std::array<ManagedAllocator*, 1 + 64> table{};
  TORCH_CHECK(device.is_cpu() || device.is_cuda(),
              "torch_uvm: managed memory is for cpu and cuda tensors, not ", device);
  int slot = device.is_cpu() ? 0 : 1 + device.index();
  TORCH_CHECK_INDEX(slot >= 0 && slot < static_cast<int>(table.size()),
                    "torch_uvm: device index out of range: ", device);
  std::lock_guard<std::mutex> lock(mutex);
  if (table[slot] == nullptr) {
    table[slot] = new ManagedAllocator(device.is_cpu() ? c10::Device(c10::kCPU) : device);
  }
  return table[slot];
}

void* raw_alloc(std::size_t bytes, at::Device device) {
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(),
                    "torch_uvm::raw_alloc: managed memory is for cpu or cuda devices, not ", device);
  device = with_index(device);
  auto& a = allocator();
  return translate_errors([&] { return a.allocate(bytes, to_index(device), current_stream_ref(device)); });
}

void raw_free(void* ptr) {
  if (ptr == nullptr) return;
  auto& a = allocator();
  translate_errors([&] { a.free(ptr); });
}

}  // namespace torch_uvm
