// The driver's unified-memory counters: every migration (each way, with its
// cause), GPU and CPU page fault, thrashing and throttling notice, with its
// address and time, recorded between start() and stop() through CUPTI's
// activity API (CUDA builds that found cupti.h; libcupti is loaded when a
// recording starts, so a build or a machine without it still runs).
//
// CUPTI's activity buffers are one per process: while another tool records
// through them (torch.profiler's kineto, Nsight Systems) these counters
// cannot, and start() says so rather than take them away.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/um_event.h"

namespace torch_uvm {

struct UmRecording {
  std::vector<UmEvent> events;   // in the order the driver reported them
  std::uint64_t dropped = 0;     // records CUPTI could not keep
  std::string missing;           // counters that could not be enabled, or ""
};

class UmCounters {
 public:
  // Starts recording. Returns "" on success, otherwise why the counters
  // cannot be recorded (no CUPTI in this build or on this machine, another
  // recording running, a device or platform without the counters).
  static std::string start();
  // Whether a recording is running.
  static bool recording();
  // Flushes and stops; the events since start(), times on the host's steady
  // clock. Call after the GPU work of interest is done (synchronize first).
  static UmRecording stop();
};

}  // namespace torch_uvm
