#include "runtime/um_counters.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/errors.h"

#if defined(TORCH_UVM_WITH_CUPTI) && !defined(TORCH_UVM_USE_HIP)
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <dlfcn.h>
#define TORCH_UVM_HAS_CUPTI 1
#endif

namespace torch_uvm {

#if defined(TORCH_UVM_HAS_CUPTI)
namespace {

// CUPTI's entry points, looked up in the libcupti the process has (torch's
// own, when torch is loaded) or can load.
struct Cupti {
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityConfigureUnifiedMemoryCounter) configure = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped_records = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
  std::string error;   // why it could not be loaded, or ""
};

template <typename F>
bool find(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  return *f != nullptr;
}

const Cupti& cupti() {
  // Leaked: CUPTI may call back while the process exits.
  static const Cupti* loaded = new Cupti([] {
    Cupti c;
    const std::string versioned = "libcupti.so." + std::to_string(CUDART_VERSION / 1000);
    void* lib = dlopen(versioned.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) lib = dlopen("libcupti.so", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      c.error = "libcupti could not be loaded (" + versioned + ": " + dlerror() +
                "); install the CUDA toolkit's CUPTI or the nvidia-cuda-cupti wheel";
      return c;
    }
    const bool all = find(lib, "cuptiGetResultString", &c.result_string) &&
                     find(lib, "cuptiActivityRegisterCallbacks", &c.register_callbacks) &&
                     find(lib, "cuptiActivityConfigureUnifiedMemoryCounter", &c.configure) &&
                     find(lib, "cuptiActivityEnable", &c.enable) &&
                     find(lib, "cuptiActivityDisable", &c.disable) &&
                     find(lib, "cuptiActivityFlushAll", &c.flush_all) &&
                     find(lib, "cuptiActivityGetNextRecord", &c.next_record) &&
                     find(lib, "cuptiActivityGetNumDroppedRecords", &c.dropped_records) &&
                     find(lib, "cuptiGetTimestamp", &c.timestamp);
    if (!all) c.error = "the libcupti found lacks the unified-memory activity API";
    return c;
  }());
  return *loaded;
}

// Every CUPTI call goes through here: the call, and CUPTI's own words.
std::string failure(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return "";
  const char* text = nullptr;
  if (cupti().result_string != nullptr) cupti().result_string(result, &text);
  return detail::concat(call, " failed: ", text ? text : "unknown CUPTI error", " (",
                        static_cast<int>(result), ")");
}

struct Recording {
  std::mutex mutex;
  bool on = false;
  bool armed = false;
  std::set<std::uint8_t*> buffers;       // ours: another client's go back untouched
  bool starting = false;                 // a start() between its check and its end
  std::uint64_t cupti_at_start = 0;      // CUPTI's clock and the steady clock read
  std::int64_t steady_at_start = 0;      // together when the recording began
  UmRecording taken;
};

Recording& state() {
  static Recording* r = new Recording();   // CUPTI may call back at exit
  return *r;
}

constexpr std::size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
  if (*buffer != nullptr) {
    Recording& r = state();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.buffers.insert(*buffer);
  }
}

UmEvent::Kind kind_of(CUpti_ActivityUnifiedMemoryCounterKind k, bool* known) {
  *known = true;
  switch (k) {
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD: return UmEvent::kToGpu;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH: return UmEvent::kToHost;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT: return UmEvent::kGpuFault;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT: return UmEvent::kCpuFault;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING: return UmEvent::kThrashing;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING: return UmEvent::kThrottling;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_REMOTE_MAP: return UmEvent::kRemoteMap;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOD: return UmEvent::kGpuToGpu;
    default: *known = false; return UmEvent::kToGpu;
  }
}

UmEvent::Cause cause_of(std::uint32_t flags) {
  switch (flags) {
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_USER: return UmEvent::kPrefetch;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE: return UmEvent::kFault;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_PREFETCH: return UmEvent::kSpeculative;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_EVICTION: return UmEvent::kEviction;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_ACCESS_COUNTERS:
      return UmEvent::kAccessCounters;
    default: return UmEvent::kUnknown;
  }
}

// CUDA 12.8 (CUPTI API 26) added the third version of the record; the
// fields read here are the same in the second.
#if CUPTI_API_VERSION >= 26
using UmRecord = CUpti_ActivityUnifiedMemoryCounter3;
#else
using UmRecord = CUpti_ActivityUnifiedMemoryCounter2;
#endif

UmEvent event_of(const UmRecord& r, bool* known) {
  UmEvent e;
  e.kind = kind_of(r.counterKind, known);
  const bool moves = e.kind == UmEvent::kToGpu || e.kind == UmEvent::kToHost ||
                     e.kind == UmEvent::kGpuToGpu;
  e.cause = moves ? cause_of(r.flags) : UmEvent::kUnknown;
  e.address = static_cast<std::uintptr_t>(r.address);
  e.value = e.kind == UmEvent::kCpuFault ? 1 : r.value;   // a CPU fault's value is its PC
  e.start_ns = static_cast<std::int64_t>(r.start);     // CUPTI's clock: stop() converts
  const bool has_end = e.kind == UmEvent::kToGpu || e.kind == UmEvent::kToHost ||
                       e.kind == UmEvent::kGpuFault || e.kind == UmEvent::kThrottling ||
                       e.kind == UmEvent::kGpuToGpu;
  e.end_ns = has_end && r.end >= r.start ? static_cast<std::int64_t>(r.end) : e.start_ns;
  // The GPU involved: the destination of a move to it, else the source.
  const std::uint32_t gpu = e.kind == UmEvent::kToGpu ? r.dstId : r.srcId;
  // (thrashing's srcId is a mask of the GPUs fighting over the range: none named)
  e.device = gpu == CUPTI_UNIFIED_MEMORY_CPU_DEVICE_ID || e.kind == UmEvent::kCpuFault ||
                     e.kind == UmEvent::kThrashing
                 ? kCpuDevice : static_cast<DeviceIndex>(gpu);
  return e;
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream, std::uint8_t* buffer,
                               std::size_t, std::size_t valid) {
  Recording& r = state();
  std::vector<UmEvent> events;
  CUpti_Activity* record = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    // A buffer another client asked for before we registered: not ours to read or free.
    if (r.buffers.erase(buffer) == 0) return;
  }
  std::uint64_t other = 0;
  while (valid > 0 && cupti().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) {
      ++other;
      continue;
    }
    bool known = false;
    UmEvent e = event_of(*reinterpret_cast<const UmRecord*>(record), &known);
    if (known) events.push_back(e);
  }
  std::size_t dropped = 0;
  cupti().dropped_records(context, stream, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(r.mutex);
  r.taken.events.insert(r.taken.events.end(), events.begin(), events.end());
  r.taken.dropped += dropped;
  r.taken.buffers += 1;
  r.taken.other += other;
}

std::int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The counters asked for; the first four are needed, the rest are kept if the
// device has them.
constexpr CUpti_ActivityUnifiedMemoryCounterKind kKinds[] = {
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_REMOTE_MAP,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOD,
};
constexpr int kNeeded = 4;
const char* const kKindNames[] = {"to_gpu", "to_host", "gpu_fault", "cpu_fault",
                                  "thrashing", "throttling", "remote_map", "gpu_to_gpu"};

std::string configure(int count) {
  CUpti_ActivityUnifiedMemoryCounterConfig config[8] = {};
  for (int i = 0; i < count; ++i) {
    config[i].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_ALL_DEVICES;
    config[i].kind = kKinds[i];
    config[i].deviceId = 0;
    config[i].enable = 1;
  }
  return failure(cupti().configure(config, static_cast<std::uint32_t>(count)),
                 "cuptiActivityConfigureUnifiedMemoryCounter");
}

}  // namespace

std::string UmCounters::start() {
  Recording& r = state();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.on || r.starting) return "a recording of the driver's counters is already running";
    r.starting = true;
  }
  struct Done {   // whatever happens, the next start() may try
    Recording& r;
    ~Done() {
      std::lock_guard<std::mutex> lock(r.mutex);
      r.starting = false;
    }
  } done{r};
  if (!cupti().error.empty()) return cupti().error;
  if (std::getenv("CUDA_INJECTION64_PATH") != nullptr) {
    return "a CUDA tool injected into this process (Nsight Systems?) holds CUPTI";
  }
  // Configuring needs the driver initialized; this does it where nothing has yet.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return "no CUDA device";
  }
  std::string why = failure(cupti().register_callbacks(buffer_requested, buffer_completed),
                            "cuptiActivityRegisterCallbacks");
  if (!why.empty()) return why;
  std::string missing;
  why = configure_dropping_optional(configure, static_cast<int>(sizeof(kKinds) / sizeof(kKinds[0])),
                                    kNeeded, kKindNames, &missing);
  if (!why.empty()) return why;
  std::uint64_t now = 0;
  why = failure(cupti().timestamp(&now), "cuptiGetTimestamp");
  if (!why.empty()) return why;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.cupti_at_start = now;
    r.steady_at_start = steady_now_ns();
    r.taken = UmRecording{};
    r.taken.missing = missing;
  }
  why = failure(cupti().enable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER),
                "cuptiActivityEnable(UNIFIED_MEMORY_COUNTER)");
  if (!why.empty()) return why;
  std::lock_guard<std::mutex> lock(r.mutex);
  r.on = true;
  r.armed = true;
  return "";
}

std::string UmCounters::arm() {
  if (armed()) return "";
  try {   // an optional feature: never a failure of the allocator that arms it
    const std::string why = start();
    if (why.empty()) stop();
    return why;
  } catch (const std::exception& e) {
    return e.what();
  }
}

bool UmCounters::armed() {
  Recording& r = state();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.armed;
}

bool UmCounters::recording() {
  Recording& r = state();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.on;
}

UmRecording UmCounters::stop() {
  Recording& r = state();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.on) throw InvalidArgument("torch_uvm: no recording of the driver's counters is running");
  }
  // Completed buffers arrive through buffer_completed (which takes the lock).
  const std::string flushed = failure(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED),
                                      "cuptiActivityFlushAll");
  const std::string disabled = failure(cupti().disable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER),
                                       "cuptiActivityDisable(UNIFIED_MEMORY_COUNTER)");
  cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::uint64_t cupti_now = 0;
  const bool timed = cupti().timestamp(&cupti_now) == CUPTI_SUCCESS;
  const std::int64_t steady_now = steady_now_ns();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.on = false;
  UmRecording out = std::move(r.taken);
  r.taken = UmRecording{};
  // CUPTI's clock to the steady clock: a line through the pairs read at start
  // and now (another client, kineto, may give CUPTI a clock of other units).
  const double span = timed && cupti_now > r.cupti_at_start
                          ? static_cast<double>(cupti_now - r.cupti_at_start) : 0.0;
  const double scale = span > 0 ? static_cast<double>(steady_now - r.steady_at_start) / span : 1.0;
  auto steady = [&](std::int64_t t) {
    return r.steady_at_start + static_cast<std::int64_t>(
                                   (static_cast<double>(t) - static_cast<double>(r.cupti_at_start)) * scale);
  };
  for (UmEvent& e : out.events) {
    e.start_ns = steady(e.start_ns);
    e.end_ns = steady(e.end_ns);
  }
  if (!flushed.empty() || !disabled.empty())
    throw RuntimeError("torch_uvm: stopping the driver's counters: " + flushed + " " + disabled);
  return out;
}

#else  // no CUPTI in this build

std::string UmCounters::start() {
#if defined(TORCH_UVM_USE_HIP)
  return "the driver's counters need CUPTI; HIP builds have none yet (rocprofiler later)";
#else
  return "this build of torch_uvm found no cupti.h; rebuild with the CUDA toolkit's CUPTI "
         "(or the nvidia-cuda-cupti wheel) installed";
#endif
}
bool UmCounters::recording() { return false; }
std::string UmCounters::arm() { return start(); }
bool UmCounters::armed() { return false; }
UmRecording UmCounters::stop() {
  throw InvalidArgument("torch_uvm: no recording of the driver's counters is running");
}

#endif

}  // namespace torch_uvm
