// The runtime interface: the only door through which the allocator reaches a
// driver. It holds exactly the calls the caching policy needs, so that the policy
// is tested on host memory (HostRuntime) and runs on CUDA or HIP (GpuRuntime)
// unchanged. Implementations report failures by throwing RuntimeError, except
// allocate_managed, which returns nullptr when the device is out of memory so the
// caller can release its cache and retry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"

namespace torch_uvm {

class Runtime {
 public:
  virtual ~Runtime() = default;

  virtual std::string name() const = 0;

  // Managed memory. allocate_managed returns nullptr on out-of-memory.
  virtual void* allocate_managed(std::size_t bytes) = 0;
  virtual void free_managed(void* ptr) = 0;

  // Pinned host memory, mapped for every GPU at the same address: the homes
  // of streamed tensors, which copy engines move at the link's speed both
  // ways at once (managed memory on either side of a copy halves that).
  // allocate_host returns nullptr when the host cannot pin more.
  virtual void* allocate_host(std::size_t bytes) = 0;
  virtual void free_host(void* ptr) = 0;

  // Hints and migration. prefetch is ordered on `stream`.
  virtual void advise(const void* ptr, std::size_t bytes, Advice advice,
                      DeviceIndex device) = 0;
  virtual void prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                        StreamRef stream) = 0;

  // Events, used to learn when work queued on a stream before a free is done.
  virtual EventHandle create_event(DeviceIndex device) = 0;
  virtual void destroy_event(EventHandle event) = 0;
  virtual void record_event(EventHandle event, StreamRef stream) = 0;
  virtual bool query_event(EventHandle event) = 0;  // true once complete
  virtual void synchronize_event(EventHandle event) = 0;
  virtual void stream_wait_event(StreamRef stream, EventHandle event) = 0;

  // Streams of the runtime's own (for work issued off the caller's thread).
  virtual StreamRef create_stream(DeviceIndex device) = 0;
  virtual void destroy_stream(StreamRef stream) = 0;
  virtual void synchronize_stream(StreamRef stream) = 0;

  // Flags: `stream` waits until the flag reaches `value` (compared cyclically,
  // as (int32_t)(flag - value) >= 0), or writes `value` once its earlier work
  // is done. create_flag returns nullptr where streams cannot wait on memory;
  // the flag starts at 0.
  virtual FlagHandle create_flag() = 0;
  virtual void destroy_flag(FlagHandle flag) = 0;
  virtual void stream_wait_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) = 0;
  virtual void stream_write_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) = 0;

  // Copies `bytes` (any direction managed memory allows, or as `kind`
  // says), ordered on `stream`; with `synchronous`, returns once the copy
  // is done.
  virtual void copy(void* dst, const void* src, std::size_t bytes, StreamRef stream,
                    bool synchronous, CopyKind kind) = 0;
  // Lets `device` read and write `peer`'s memory directly. A no-op where it
  // already can, or never can.
  virtual void enable_peer_access(DeviceIndex device, DeviceIndex peer) = 0;
  // The GPU a stream handle belongs to, or `fallback` where the runtime
  // cannot tell (CUDA before 12.8, the null stream).
  virtual DeviceIndex stream_device(std::uintptr_t handle, DeviceIndex fallback) = 0;

  // Devices.
  virtual int device_count() = 0;
  virtual DeviceIndex current_device() = 0;
  virtual DeviceMemoryInfo memory_info(DeviceIndex device) = 0;
};

}  // namespace torch_uvm
