// A c10::Allocator handing out managed memory for one device. It fills c10's
// CPU allocator slot when UVM is on, and backs manage_memory() for any device.
#pragma once

#include <c10/core/Allocator.h>

#include "core/types.h"

namespace torch_uvm {

class ManagedAllocator final : public c10::Allocator {
 public:
  explicit ManagedAllocator(c10::Device device) : device_(device) {}
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &free_managed; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  // The deleter of every DataPtr this class makes.
  static void free_managed(void* ptr);

  // The ones for the CPU and each GPU (created on first use).
  static ManagedAllocator* for_device(c10::Device device);

 private:
  c10::Device device_;
};

// `device` with its index filled in: "cuda" means the current GPU.
c10::Device with_index(c10::Device device);

// The allocator's name for a device: kCpuDevice or the GPU's index.
DeviceIndex to_index(c10::Device device);

// The stream on which `device` works now: the current CUDA stream of a GPU,
// or the host "stream" for the CPU.
StreamRef current_stream_ref(c10::Device device);

}  // namespace torch_uvm
