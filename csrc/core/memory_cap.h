// The cap on managed bytes. Managed memory can be oversubscribed past what the
// GPU holds, and on a shared card that can stall every process using it. So
// reserved bytes stay under a cap, by default a fraction of the smallest free
// device memory seen at start; a cap above that free memory needs an explicit
// opt-in (allow_oversubscription).
#pragma once

#include <cstddef>

#include "core/config.h"
#include "core/runtime.h"

namespace torch_uvm {

class MemoryCap {
 public:
  // Reads free memory of every device once. With no device, the safe limit
  // is 0: managed memory cannot be allocated at all.
  MemoryCap(Runtime& runtime, const AllocatorConfig& config);

  std::size_t cap() const { return cap_; }
  // Free device memory at start (the smallest over devices).
  std::size_t safe_limit() const { return safe_limit_; }
  bool allow_oversubscription() const { return allow_oversubscription_; }

  // Validates and sets a new cap in bytes. Throws InvalidArgument if it is 0
  // or above the safe limit without allow_oversubscription.
  void set(std::size_t bytes);
  void set_allow_oversubscription(bool allow) { allow_oversubscription_ = allow; }

  bool admits(std::size_t reserved, std::size_t extra) const {
    return extra <= cap_ && reserved <= cap_ - extra;
  }

 private:
  std::size_t safe_limit_ = 0;
  std::size_t cap_ = 0;
  bool allow_oversubscription_ = false;
};

}  // namespace torch_uvm
