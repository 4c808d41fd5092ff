// How big things are: the rounding of requests, which pool a request belongs to,
// how large a new segment is, and whether a cached block is split to serve a
// request. The rest of the allocator asks these questions and nothing else
// decides sizes.
#pragma once

#include <cstddef>

#include "core/config.h"

namespace torch_uvm {

// Every block starts on, and is a multiple of, this alignment (as PyTorch's).
constexpr std::size_t kMinBlockSize = 512;

class SizePolicy {
 public:
  explicit SizePolicy(const AllocatorConfig& config) : config_(config) {}

  // The bytes a request occupies. Throws InvalidArgument if rounding overflows.
  std::size_t round_request(std::size_t requested) const;

  bool is_small(std::size_t rounded) const { return rounded <= config_.small_size; }

  // Bytes of the segment created when no cached block fits `rounded`.
  // Throws InvalidArgument if rounding overflows.
  std::size_t segment_size(std::size_t rounded) const;

  // Whether a free block of `block_size` serving `rounded` is split, leaving the
  // tail cached: only when the tail is big enough to serve a later request of
  // its pool, and never for blocks at or over max_split_size.
  bool should_split(std::size_t block_size, std::size_t rounded) const;

  // Whether a cached block of `block_size` may serve `rounded` at all: an
  // unsplittable (oversize) block is not handed to a much smaller request.
  bool may_serve(std::size_t block_size, std::size_t rounded) const;

  const AllocatorConfig& config() const { return config_; }

 private:
  AllocatorConfig config_;
};

}  // namespace torch_uvm
