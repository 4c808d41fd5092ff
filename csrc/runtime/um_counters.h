// The driver's unified-memory counters: every migration (each way, with its
// cause), GPU and CPU page fault, thrashing and throttling notice, with its
// address and time, recorded between start() and stop() through CUPTI's
// activity API (CUDA builds that found cupti.h; libcupti is loaded when a
// recording starts, so a build or a machine without it still runs).
//
// The driver reports only managed memory allocated after unified-memory
// counting was first enabled in the process (measured on the H100: a range
// allocated before it shows no migration or fault, one allocated after
// shows every one, in any later recording). arm() does that first enabling
// where nothing is recorded yet: the allocator's creation calls it
// (PYTORCH_UVM_ALLOC_CONF driver_counters, default on).
//
// CUPTI's activity buffers are one per process: while another tool records
// through them (torch.profiler's kineto, Nsight Systems) these counters
// cannot, and start() says so rather than take them away.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/um_event.h"

namespace torch_uvm {

struct UmRecording {
  std::vector<UmEvent> events;   // in the order the driver reported them
  std::uint64_t dropped = 0;     // records CUPTI could not keep
  std::uint64_t buffers = 0;     // activity buffers CUPTI handed back
  std::uint64_t other = 0;       // records of other kinds in them (another client's)
  std::string missing;           // counters that could not be enabled, or ""
};

// How start() enables the counters where a device lacks some: `configure(n)`
// enables the first `n` kinds ("" or why not); the optional ones (past
// `needed`) are dropped from the last, one at a time, until it succeeds.
// Returns "" or why not even the needed ones could be; `missing` gets the
// names (`names[i]` for kind i) of those dropped, ", "-separated: the
// profile's warning "this GPU does not report: ..." (torch_uvm/profile.py).
inline std::string configure_dropping_optional(const std::function<std::string(int)>& configure,
                                               int count, int needed, const char* const names[],
                                               std::string* missing) {
  missing->clear();
  std::string why = configure(count);
  for (; !why.empty() && count > needed;) {
    --count;
    *missing += std::string(missing->empty() ? "" : ", ") + names[count];
    why = configure(count);
  }
  return why;
}

class UmCounters {
 public:
  // Starts recording. Returns "" on success, otherwise why the counters
  // cannot be recorded (no CUPTI in this build or on this machine, another
  // recording running, a device or platform without the counters).
  static std::string start();
  // Whether a recording is running.
  static bool recording();
  // Enables and disables the counters once, so that every managed
  // allocation after it can be seen by later recordings (~0.1-0.2 s, the
  // first time only). Returns "" or why not (as start()).
  static std::string arm();
  // Whether arm() or start() succeeded before.
  static bool armed();
  // Flushes and stops; the events since start(), times on the host's steady
  // clock. Call after the GPU work of interest is done (synchronize first).
  static UmRecording stop();
};

}  // namespace torch_uvm
