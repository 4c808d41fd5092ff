#include "core/um_event.h"

namespace torch_uvm {

const char* kind_name(UmEvent::Kind kind) {
  switch (kind) {
    case UmEvent::kToGpu: return "to_gpu";
    case UmEvent::kToHost: return "to_host";
    case UmEvent::kGpuFault: return "gpu_fault";
    case UmEvent::kCpuFault: return "cpu_fault";
    case UmEvent::kThrashing: return "thrashing";
    case UmEvent::kThrottling: return "throttling";
    case UmEvent::kRemoteMap: return "remote_map";
    case UmEvent::kGpuToGpu: return "gpu_to_gpu";
  }
  return "unknown";
}

const char* cause_name(UmEvent::Cause cause) {
  switch (cause) {
    case UmEvent::kUnknown: return "unknown";
    case UmEvent::kPrefetch: return "prefetch";
    case UmEvent::kFault: return "fault";
    case UmEvent::kSpeculative: return "speculative";
    case UmEvent::kEviction: return "eviction";
    case UmEvent::kAccessCounters: return "access_counters";
  }
  return "unknown";
}

}  // namespace torch_uvm
