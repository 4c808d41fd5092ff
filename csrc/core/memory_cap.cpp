#include "core/memory_cap.h"

#include <algorithm>
#include <cstdint>

#include "core/errors.h"

namespace torch_uvm {

MemoryCap::MemoryCap(Runtime& runtime, const AllocatorConfig& config)
    : allow_oversubscription_(config.allow_oversubscription) {
  int n = runtime.device_count();
  safe_limit_ = n > 0 ? SIZE_MAX : 0;
  for (int d = 0; d < n; ++d) {
    safe_limit_ = std::min(safe_limit_, runtime.memory_info(d).free_bytes);
  }
  if (config.cap_bytes != 0) {
    set(config.cap_bytes);
  } else {
    cap_ = static_cast<std::size_t>(static_cast<double>(safe_limit_) *
                                    config.cap_fraction);
  }
}

void MemoryCap::set(std::size_t bytes) {
  TORCH_UVM_CHECK_ARG(bytes > 0, "the managed memory cap must be positive");
  TORCH_UVM_CHECK_ARG(
      bytes <= safe_limit_ || allow_oversubscription_,
      "a managed memory cap of ", format_bytes(bytes),
      " exceeds the free device memory (", format_bytes(safe_limit_),
      "). Oversubscribing managed memory can stall the GPU for every process "
      "on it. Use a smaller cap, or opt in with allow_oversubscription "
      "(PYTORCH_UVM_ALLOC_CONF=allow_oversubscription:1 or "
      "set_memory_cap(..., allow_oversubscription=True)).");
  cap_ = bytes;
}

}  // namespace torch_uvm
