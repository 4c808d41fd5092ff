// The cap on managed bytes. Managed memory can be oversubscribed past what the
// GPU holds, and on a shared card that can stall every process using it. So
// reserved bytes stay under a cap, by default a fraction of the smallest free
// memory of the GPUs in use; a cap above that free memory needs an explicit
// opt-in (allow_oversubscription).
//
// A GPU's free memory is read when the allocator first works for it, not at
// start: reading it creates a CUDA context (~500 MiB), and a torchrun rank
// must hold one on its own GPU only.
//
// Beside the cap, each GPU may have a memory fraction, as
// torch.cuda.set_per_process_memory_fraction defines it: the bytes whose home
// is that GPU stay under fraction x its total memory.
#pragma once

#include <cstddef>
#include <map>
#include <set>

#include "core/config.h"
#include "core/runtime.h"

namespace torch_uvm {

class MemoryCap {
 public:
  // Reads no device memory yet (see use_device).
  MemoryCap(Runtime& runtime, const AllocatorConfig& config);

  // Notes that the allocator works for `device` (a GPU index): its free
  // memory joins the safe limit. Cheap after the first call per device.
  // Throws InvalidArgument if a configured cap is now above the safe limit.
  void use_device(DeviceIndex device);

  // The cap in bytes; if no GPU was used yet, the current one's is read.
  std::size_t cap();
  // The smallest free memory of the GPUs in use, when each was first used.
  std::size_t safe_limit();

  // Validates and sets a new cap in bytes. Throws InvalidArgument if it is 0
  // or above the safe limit, unless `allow_oversubscription` or the
  // configuration's allow_oversubscription says so. The opt-in belongs to
  // this cap: a later set() without it is checked again.
  void set(std::size_t bytes, bool allow_oversubscription = false);

  // Whether `extra` more bytes fit under the cap, and under `home`'s memory
  // fraction given `home_reserved` bytes reserved there.
  bool admits(std::size_t reserved, std::size_t extra) {
    std::size_t c = cap();
    return extra <= c && reserved <= c - extra;
  }
  bool admits_on(DeviceIndex home, std::size_t home_reserved, std::size_t extra) const;

  // torch.cuda.set_per_process_memory_fraction: 0 <= fraction <= 1. Throws
  // InvalidArgument otherwise. The limit is fraction x the GPU's total memory.
  void set_fraction(DeviceIndex device, double fraction);
  double fraction(DeviceIndex device) const;
  // The fraction's limit in bytes, or SIZE_MAX if none is set for `device`.
  std::size_t fraction_limit(DeviceIndex device) const;

 private:
  void resolve_default();

  Runtime& runtime_;
  double cap_fraction_;
  std::size_t safe_limit_ = SIZE_MAX;  // SIZE_MAX: no GPU read yet
  std::size_t cap_ = 0;                // 0: not resolved yet
  bool cap_explicit_ = false;
  const bool config_allows_oversubscription_;
  bool cap_may_oversubscribe_ = false;
  std::set<DeviceIndex> used_;  // GPUs whose free memory was read
  struct Fraction {
    double fraction;
    std::size_t limit;
  };
  std::map<DeviceIndex, Fraction> fractions_;
};

}  // namespace torch_uvm
