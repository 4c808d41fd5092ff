// A copy from a GPU into CPU memory through pinned buffers (staged_copy.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace torch_uvm {

// Pieces of this size, two pinned buffers of it.
constexpr std::size_t kStagedPieceBytes = 16u << 20;

// Copies `src` (a CUDA tensor) into `dst` (a contiguous CPU tensor of the
// same dtype and shape), and returns when it is there.
void staged_copy_to_cpu(at::Tensor& dst, const at::Tensor& src);

}  // namespace torch_uvm
