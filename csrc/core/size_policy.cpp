#include "core/size_policy.h"

#include <cstdint>

#include "core/errors.h"

namespace torch_uvm {
namespace {

// Rounds `n` up to a multiple of `unit` (a power of two) or throws on overflow.
std::size_t round_up(std::size_t n, std::size_t unit, std::size_t requested) {
  TORCH_UVM_CHECK_ARG(n <= SIZE_MAX - (unit - 1),
                      "a request of ", requested,
                      " bytes overflows when rounded to ", unit,
                      " bytes; ask for a smaller tensor");
  return (n + unit - 1) & ~(unit - 1);
}

std::size_t floor_power2(std::size_t n) {
  std::size_t p = 1;
  while (p <= n / 2) p <<= 1;
  return p;
}

}  // namespace

std::size_t SizePolicy::round_request(std::size_t requested) const {
  std::size_t n = requested == 0 ? 1 : requested;
  std::size_t divisions = config_.roundup_power2_divisions;
  if (divisions > 1 && n > kMinBlockSize) {
    // Steps of (2^k)/divisions between 2^k and 2^(k+1): fewer distinct sizes,
    // so freed blocks are reused by requests that differ slightly.
    std::size_t low = floor_power2(n);
    std::size_t step = low / divisions;
    if (step >= kMinBlockSize) n = round_up(n, step, requested);
  }
  return round_up(n, kMinBlockSize, requested);
}

std::size_t SizePolicy::segment_size(std::size_t rounded) const {
  if (is_small(rounded)) return config_.small_segment_size;
  if (rounded < config_.large_segment_threshold &&
      rounded <= config_.large_segment_size) {
    return config_.large_segment_size;
  }
  return round_up(rounded, config_.segment_round, rounded);
}

bool SizePolicy::should_split(std::size_t block_size, std::size_t rounded) const {
  if (block_size >= config_.max_split_size) return false;
  std::size_t remaining = block_size - rounded;
  // Small pool: any tail that can hold one block. Large pool: a tail that a
  // large request could use; smaller tails stay as slack in the block.
  return is_small(rounded) ? remaining >= kMinBlockSize
                           : remaining > config_.small_size;
}

bool SizePolicy::may_serve(std::size_t block_size, std::size_t rounded) const {
  if (rounded < config_.max_split_size && block_size >= config_.max_split_size) {
    return false;  // would waste an unsplittable block on a small request
  }
  if (rounded >= config_.max_split_size &&
      block_size >= rounded + config_.large_segment_size) {
    return false;  // oversize blocks only serve requests of about their size
  }
  return true;
}

}  // namespace torch_uvm
