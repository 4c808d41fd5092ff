#include "core/residency.h"

#include <algorithm>
#include <mutex>

#include "core/errors.h"

namespace torch_uvm {

ResidencyBudget::PerDevice& ResidencyBudget::per_device(DeviceIndex device) {
  return devices_[device];
}

void ResidencyBudget::set_limit(DeviceIndex device, std::optional<std::size_t> bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(device >= 0, "a residency budget is for a GPU, got device ", device);
  TORCH_UVM_CHECK_ARG(!bytes || *bytes > 0, "a residency budget must be positive");
  PerDevice& d = per_device(device);
  d.limit = bytes;
  d.stats.limit = bytes.value_or(0);
}

std::optional<std::size_t> ResidencyBudget::limit(DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? std::nullopt : it->second.limit;
}

void ResidencyBudget::erase(Lru::iterator it) {
  ResidencyStats& s = devices_[it->device].stats;
  s.resident_bytes -= it->bytes;
  where_.erase(it->address);
  devices_[it->device].lru.erase(it);
}

std::vector<EvictionStep> ResidencyBudget::admit(DeviceIndex device, std::uintptr_t address,
                                                 std::size_t bytes, bool written) {
  std::lock_guard<std::mutex> lock(mutex_);
  PerDevice& d = per_device(device);
  if (auto it = where_.find(address); it != where_.end()) {
    Range range = *it->second;
    if (range.device == device && range.bytes == bytes) {  // resident: most recently used
      range.written = range.written || written;
      d.lru.erase(it->second);
      it->second = d.lru.insert(d.lru.end(), range);
      return {};
    }
    erase(it->second);  // elsewhere, or another size: admitted anew
  }
  std::vector<EvictionStep> steps;
  if (d.limit) {
    TORCH_UVM_CHECK_ARG(bytes <= *d.limit, "a range of ", bytes,
                        " bytes cannot fit a residency budget of ", *d.limit, " bytes on cuda:",
                        device);
    std::size_t evictable = 0;
    for (const Range& r : d.lru) evictable += r.busy ? 0 : r.bytes;
    TORCH_UVM_CHECK_ARG(d.stats.resident_bytes - evictable + bytes <= *d.limit,
                        "bringing ", bytes, " bytes to cuda:", device, " would exceed its ",
                        "residency budget of ", *d.limit, " bytes even after evicting every ",
                        "range not in use (", d.stats.resident_bytes - evictable,
                        " bytes are in use)");
    for (auto it = d.lru.begin(); it != d.lru.end() && d.stats.resident_bytes + bytes > *d.limit;) {
      if (it->busy) {
        ++it;
        continue;
      }
      const Eviction how = it->written ? Eviction::kMigrate : Eviction::kDropCopy;
      steps.push_back({it->address, it->bytes, how});
      ++d.stats.evictions[static_cast<int>(how)];
      d.stats.evicted_bytes[static_cast<int>(how)] += it->bytes;
      auto next = std::next(it);
      erase(it);
      it = next;
    }
  }
  where_[address] = d.lru.insert(d.lru.end(), Range{device, address, bytes, written, false});
  d.stats.resident_bytes += bytes;
  d.stats.prefetched_bytes += bytes;
  d.stats.peak_resident_bytes = std::max(d.stats.peak_resident_bytes, d.stats.resident_bytes);
  return steps;
}

void ResidencyBudget::set_busy(std::uintptr_t address, bool busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = where_.find(address); it != where_.end()) it->second->busy = busy;
}

void ResidencyBudget::mark_written(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = where_.find(address); it != where_.end()) it->second->written = true;
}

void ResidencyBudget::forget(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = where_.find(address); it != where_.end()) erase(it->second);
}

bool ResidencyBudget::is_resident(DeviceIndex device, std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(address);
  return it != where_.end() && it->second->device == device;
}

bool ResidencyBudget::is_busy(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(address);
  return it != where_.end() && it->second->busy;
}

ResidencyStats ResidencyBudget::stats(DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? ResidencyStats{} : it->second.stats;
}

void ResidencyBudget::reset_peak(DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  ResidencyStats& s = per_device(device).stats;
  s.peak_resident_bytes = s.resident_bytes;
}

}  // namespace torch_uvm
