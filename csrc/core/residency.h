// What decides eviction: a residency budget per GPU over the memory torch_uvm
// brings there (streamed modules, prefetching iterators, explicit prefetches),
// and the least recently used ranges that leave when a new one would exceed
// it. Policy only: the glue (torch_uvm/residency.py via the bindings) carries
// out the evictions it returns, with the mechanism it names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/types.h"

namespace torch_uvm {

// How a range leaves a GPU. A range not written since it arrived (a
// read-mostly duplicate: weights in inference) only drops its GPU copy; a
// written one migrates back to the CPU.
enum class Eviction { kDropCopy = 0, kMigrate = 1 };

struct EvictionStep {
  std::uintptr_t address;
  std::size_t bytes;
  Eviction how;
};

struct ResidencyStats {
  std::size_t limit = 0;  // 0: no budget
  std::size_t resident_bytes = 0;
  std::size_t peak_resident_bytes = 0;
  std::size_t prefetched_bytes = 0;
  std::size_t evictions[2] = {0, 0};       // by Eviction
  std::size_t evicted_bytes[2] = {0, 0};   // by Eviction
};

// Internally synchronized: the copy kernels read the limits from any thread.
class ResidencyBudget {
 public:
  // Budget of `device` in bytes; nullopt removes it. A budget below what is
  // resident now is allowed: the next admit evicts down to it.
  void set_limit(DeviceIndex device, std::optional<std::size_t> bytes);
  std::optional<std::size_t> limit(DeviceIndex device) const;

  // `bytes` at `address` are about to be brought to `device`. Returns the
  // ranges to evict first, least recently used first, never a busy one. An
  // admitted range counts as resident and most recently used. Already
  // resident: only touched. Throws InvalidArgument when the range cannot fit
  // even after evicting every range that is not busy.
  std::vector<EvictionStep> admit(DeviceIndex device, std::uintptr_t address, std::size_t bytes,
                                  bool written);

  // A range in use by work still running may not be evicted.
  void set_busy(std::uintptr_t address, bool busy);
  // Written since it arrived: it must migrate back when evicted.
  void mark_written(std::uintptr_t address);
  // The range left without an eviction (freed, or moved by the user).
  void forget(std::uintptr_t address);

  bool is_resident(DeviceIndex device, std::uintptr_t address) const;
  bool is_busy(std::uintptr_t address) const;
  ResidencyStats stats(DeviceIndex device) const;
  void reset_peak(DeviceIndex device);

 private:
  struct Range {
    DeviceIndex device;
    std::uintptr_t address;
    std::size_t bytes;
    bool written;
    bool busy;
  };
  using Lru = std::list<Range>;  // front: least recently used
  struct PerDevice {
    std::optional<std::size_t> limit;
    Lru lru;
    ResidencyStats stats;
  };
  PerDevice& per_device(DeviceIndex device);
  void erase(Lru::iterator it);

  mutable std::mutex mutex_;
  std::map<DeviceIndex, PerDevice> devices_;
  std::unordered_map<std::uintptr_t, Lru::iterator> where_;
};

}  // namespace torch_uvm
