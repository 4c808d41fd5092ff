// One unified-memory event the driver reported (through CUPTI's unified
// memory counters, csrc/runtime/um_counters.h): a migration, a page fault, a
// thrashing or throttling notice. Plain data, so that the attribution
// (core/address_names.h) and its tests need no driver.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace torch_uvm {

struct UmEvent {
  enum Kind : std::uint8_t {
    kToGpu,        // bytes migrated host -> GPU
    kToHost,       // bytes migrated GPU -> host
    kGpuFault,     // a GPU page fault group (value: faults)
    kCpuFault,     // a CPU page fault (value: 1)
    kThrashing,    // the driver saw the range thrash (value: bytes)
    kThrottling,   // the driver throttled a processor on the range
    kRemoteMap,    // the driver mapped the range remotely instead of moving it (bytes)
    kGpuToGpu,     // bytes migrated between GPUs
  };
  // Why a migration happened (CUPTI's migration cause).
  enum Cause : std::uint8_t {
    kUnknown,
    kPrefetch,        // the user's prefetch (cudaMemPrefetchAsync)
    kFault,           // coherence: a fault or an access needed the pages
    kSpeculative,     // the driver's own prefetch around a fault
    kEviction,        // evicted to make room on the GPU
    kAccessCounters,  // moved by access counters
  };
  Kind kind = kToGpu;
  Cause cause = kUnknown;
  std::uintptr_t address = 0;
  std::uint64_t value = 0;       // bytes, or a count (see Kind)
  std::int64_t start_ns = 0;     // the host's steady clock
  std::int64_t end_ns = 0;       // == start_ns for instants
  DeviceIndex device = kCpuDevice;   // the GPU involved (-1: none known)

  // Whether `value` is bytes of memory (split across named ranges) rather
  // than a count.
  bool counts_bytes() const {
    return kind == kToGpu || kind == kToHost || kind == kThrashing ||
           kind == kRemoteMap || kind == kGpuToGpu;
  }
};

const char* kind_name(UmEvent::Kind kind);    // "to_gpu", "gpu_fault", ...
const char* cause_name(UmEvent::Cause cause); // "prefetch", "fault", ...

}  // namespace torch_uvm
