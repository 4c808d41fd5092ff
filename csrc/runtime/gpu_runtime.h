// GpuRuntime: the Runtime over CUDA (or HIP, built with TORCH_UVM_USE_HIP).
// The only code in torch_uvm that calls the driver; every call goes through
// one check that names the call and the driver's error.
#pragma once

#include "core/runtime.h"

namespace torch_uvm {

class GpuRuntime : public Runtime {
 public:
  std::string name() const override;
  void* allocate_managed(std::size_t bytes) override;
  void free_managed(void* ptr) override;
  void* allocate_host(std::size_t bytes) override;
  void free_host(void* ptr) override;
  void advise(const void* ptr, std::size_t bytes, Advice advice,
              DeviceIndex device) override;
  void prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                StreamRef stream) override;
  EventHandle create_event(DeviceIndex device) override;
  void destroy_event(EventHandle event) override;
  void record_event(EventHandle event, StreamRef stream) override;
  bool query_event(EventHandle event) override;
  void synchronize_event(EventHandle event) override;
  void stream_wait_event(StreamRef stream, EventHandle event) override;
  StreamRef create_stream(DeviceIndex device) override;
  void destroy_stream(StreamRef stream) override;
  void synchronize_stream(StreamRef stream) override;
  FlagHandle create_flag() override;
  void destroy_flag(FlagHandle flag) override;
  void stream_wait_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) override;
  void stream_write_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) override;
  void copy(void* dst, const void* src, std::size_t bytes, StreamRef stream,
            bool synchronous, CopyKind kind) override;
  void enable_peer_access(DeviceIndex device, DeviceIndex peer) override;
  DeviceIndex stream_device(std::uintptr_t handle, DeviceIndex fallback) override;
  int device_count() override;
  DeviceIndex current_device() override;
  DeviceMemoryInfo memory_info(DeviceIndex device) override;

  // Whether `device` supports prefetch and advice on managed memory
  // (concurrentManagedAccess).
  bool concurrent_managed_access(DeviceIndex device);
};

}  // namespace torch_uvm
