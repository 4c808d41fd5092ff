#include "core/memory_cap.h"

#include <algorithm>
#include <cstdint>

#include "core/errors.h"

namespace torch_uvm {

MemoryCap::MemoryCap(Runtime& runtime, const AllocatorConfig& config)
    : runtime_(runtime),
      cap_fraction_(config.cap_fraction),
      config_allows_oversubscription_(config.allow_oversubscription) {
  if (runtime_.device_count() == 0) safe_limit_ = 0;  // nothing can be allocated
  if (config.cap_bytes != 0) {
    TORCH_UVM_CHECK_ARG(config.cap_bytes > 0, "the managed memory cap must be positive");
    cap_ = config.cap_bytes;  // checked against the safe limit once a GPU is read
    cap_explicit_ = true;
    cap_may_oversubscribe_ = config.allow_oversubscription;
  }
}

void MemoryCap::use_device(DeviceIndex device) {
  if (device < 0 || used_.count(device)) return;
  const std::size_t limit = std::min(safe_limit_, runtime_.memory_info(device).free_bytes);
  // Checked before anything changes: a refused cap stays refused next time.
  TORCH_UVM_CHECK_ARG(
      !cap_explicit_ || cap_may_oversubscribe_ || cap_ <= limit,
      "a managed memory cap of ", format_bytes(cap_), " exceeds the free device memory (",
      format_bytes(limit), " on ", device_name(device),
      "). Oversubscribing managed memory can stall the GPU for every process on it. Use a "
      "smaller cap, or opt in with allow_oversubscription "
      "(PYTORCH_UVM_ALLOC_CONF=allow_oversubscription:1 or "
      "set_memory_cap(..., allow_oversubscription=True)).");
  used_.insert(device);
  safe_limit_ = limit;
  if (!cap_explicit_) resolve_default();
}

void MemoryCap::resolve_default() {
  cap_ = static_cast<std::size_t>(static_cast<double>(safe_limit_) * cap_fraction_);
}

std::size_t MemoryCap::safe_limit() {
  if (used_.empty() && safe_limit_ != 0) use_device(runtime_.current_device());
  return safe_limit_;
}

std::size_t MemoryCap::cap() {
  if (used_.empty() && safe_limit_ != 0) use_device(runtime_.current_device());
  // No GPU: nothing can be allocated, unless oversubscription was asked for.
  return safe_limit_ == 0 && !cap_may_oversubscribe_ ? 0 : cap_;
}

void MemoryCap::set(std::size_t bytes, bool allow_oversubscription) {
  TORCH_UVM_CHECK_ARG(bytes > 0, "the managed memory cap must be positive");
  std::size_t limit = safe_limit();
  const bool allowed = allow_oversubscription || config_allows_oversubscription_;
  TORCH_UVM_CHECK_ARG(
      bytes <= limit || allowed,
      "a managed memory cap of ", format_bytes(bytes),
      " exceeds the free device memory (", format_bytes(limit),
      "). Oversubscribing managed memory can stall the GPU for every process "
      "on it. Use a smaller cap, or opt in with allow_oversubscription "
      "(PYTORCH_UVM_ALLOC_CONF=allow_oversubscription:1 or "
      "set_memory_cap(..., allow_oversubscription=True)).");
  cap_ = bytes;
  cap_explicit_ = true;
  cap_may_oversubscribe_ = allowed;
}

bool MemoryCap::admits_on(DeviceIndex home, std::size_t home_reserved,
                          std::size_t extra) const {
  std::size_t limit = fraction_limit(home);
  return limit == SIZE_MAX || (extra <= limit && home_reserved <= limit - extra);
}

void MemoryCap::set_fraction(DeviceIndex device, double fraction) {
  TORCH_UVM_CHECK_ARG(device >= 0 && device < runtime_.device_count(),
                      "torch_uvm: set_per_process_memory_fraction: no GPU ", device);
  TORCH_UVM_CHECK_ARG(fraction >= 0.0 && fraction <= 1.0,
                      "torch_uvm: a memory fraction must be in [0, 1], got ", fraction);
  std::size_t total = runtime_.memory_info(device).total_bytes;
  fractions_[device] = {fraction, static_cast<std::size_t>(fraction * static_cast<double>(total))};
}

double MemoryCap::fraction(DeviceIndex device) const {
  auto it = fractions_.find(device);
  return it == fractions_.end() ? 1.0 : it->second.fraction;
}

std::size_t MemoryCap::fraction_limit(DeviceIndex device) const {
  auto it = fractions_.find(device);
  return it == fractions_.end() ? SIZE_MAX : it->second.limit;
}

}  // namespace torch_uvm
