// Tunable options of the allocator, parsed from PYTORCH_UVM_ALLOC_CONF
// ("key:value,key:value", the style of PYTORCH_CUDA_ALLOC_CONF). Every option is
// one row of the table in config.cpp with its default and meaning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_uvm {

struct AllocatorConfig {
  // Requests up to this size come from the small pool.
  std::size_t small_size = 1u << 20;
  // Small pool segments; the GPU's large page is 2 MiB.
  std::size_t small_segment_size = 2u << 20;
  // Large requests under `large_segment_threshold` share segments of this size.
  std::size_t large_segment_size = 20u << 20;
  std::size_t large_segment_threshold = 10u << 20;
  // Larger requests get their own segment rounded up to this granularity.
  std::size_t segment_round = 2u << 20;
  // Blocks of at least this size are never split; SIZE_MAX disables the limit.
  std::size_t max_split_size = SIZE_MAX;
  // Round requests up to 1/N steps between powers of two (0 = off).
  std::size_t roundup_power2_divisions = 0;
  // empty_cache() keeps up to this many bytes of free segments.
  std::size_t release_threshold = 0;
  // Default cap: this fraction of the smallest free device memory at start.
  double cap_fraction = 0.8;
  // An explicit cap in bytes (0 = use cap_fraction).
  std::size_t cap_bytes = 0;
  // Let the cap exceed the devices' free memory. Oversubscribing managed
  // memory can stall the GPU for every process on it: opt in only knowingly.
  bool allow_oversubscription = false;
  // Set preferred location / accessed-by once when a segment is created.
  bool advise_segments = true;
  // Issue the prefetch of a zero-copy move to a GPU from a worker thread
  // (prefetch_queue.h), so that the call returns at once.
  bool async_prefetch = true;
  // The worker issues prefetches in pieces of this size (0: one call).
  std::size_t prefetch_chunk = 0;
  // Residency budget per GPU for streamed memory (0: none); carried out by
  // torch_uvm/offload.py, decided by core/residency.h.
  std::size_t residency_limit = 0;
  // Prefetch each new GPU-home allocation to its GPU, on its stream.
  bool prefetch_on_alloc = false;
  // Enable the driver's unified-memory counters once when the allocator
  // starts, so that torch_uvm.profile() sees all of its memory
  // (runtime/um_counters.h: the driver counts only allocations made after).
  bool driver_counters = true;
};

// Parses "key:value,..." on top of `base`. Throws InvalidArgument naming the
// bad key or value and listing the valid keys.
AllocatorConfig parse_config(const std::string& text,
                             AllocatorConfig base = AllocatorConfig{});

// The config from PYTORCH_UVM_ALLOC_CONF (defaults when unset).
AllocatorConfig config_from_environment();

// One line per option: "name (default) meaning", for docs and error messages.
std::vector<std::string> describe_options();

// An offload's settings that come from environment variables of their own,
// one row each in config.cpp's second table (torch_uvm/host_step.py reads
// them through torch_uvm._C.offload_environment()).
struct OffloadEnvironment {
  // TORCH_UVM_HOST_STEP_THREADS: the threads a host step runs on; 0: unset.
  int host_step_threads = 0;
  // TORCH_UVM_HOST_STEP_COPIES: the share of the budget that gradients
  // copying home in backward may take before it waits, 0 to 1; < 0: unset.
  double host_step_copies = -1;
  // TORCH_UVM_QUIET: no progress shown on an offload's long waits
  // (pinning its homes, reading a checkpoint: torch_uvm/progress.py).
  bool quiet = false;
};

// Sets `variable`'s field of `env` from `value` (empty: unset). Throws
// InvalidArgument naming the variable, what it takes and what it got.
void parse_offload_variable(const std::string& variable, const std::string& value,
                            OffloadEnvironment& env);
// The variables as the process's environment has them now.
OffloadEnvironment offload_environment();
// One line per variable: "NAME (default) meaning".
std::vector<std::string> describe_offload_variables();

// Parses a boolean environment value: 1/0, true/false, yes/no, on/off
// (case-insensitive). Throws InvalidArgument naming `what` otherwise.
bool parse_bool(const std::string& value, const std::string& what);

}  // namespace torch_uvm
