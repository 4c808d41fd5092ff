// Where a streamed tensor lives off the GPU: its home, pinned host memory
// mapped for the GPUs at the same address (the runtime's allocate_host).
// Copy engines move it to and from device memory at the link's speed both
// ways at once (pinned 86 GB/s together, managed 51: benchmarks/results/
// 2026-11-23-h100/mechanisms-uvm-*.log); kernels read it in place over PCIe;
// the CPU reads it as any host memory.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace torch_uvm {

// `bytes` of pinned host memory, as a storage seen on `device` (a GPU):
// tensors over it are CUDA tensors. Throws c10::OutOfMemoryError if the
// host cannot pin that much.
c10::Storage make_pinned_home(std::size_t bytes, c10::Device device);

// Whether `memory` is a home make_pinned_home made.
bool is_pinned_home(const c10::DataPtr& memory);

// A new home of `like`'s sizes and dtype (any device, a meta tensor's
// included), uninitialized, as a contiguous CUDA tensor on `device` owning
// all of it: a checkpoint's bytes are read straight into it.
at::Tensor pinned_home_empty(const at::Tensor& like, c10::Device device);

// `t`'s value (any device; contiguous) in a new home, as a CUDA tensor on
// `device` owning all of it. Waits for the copy.
at::Tensor pinned_home_copy(const at::Tensor& t, c10::Device device);

// `home` (a tensor over a home make_pinned_home made, which no streamed
// tensor has taken over) as a CPU tensor over the same memory, keeping the
// home alive: offload's originals read their values there instead of
// holding a second copy. The caller keeps the home from being taken over
// while the alias lives (a take-over moves the memory out of its storage).
at::Tensor fresh_home_on_cpu(const at::Tensor& home);

}  // namespace torch_uvm
