// Installing torch_uvm into PyTorch's allocator slots.
#pragma once

namespace torch_uvm {

// Replaces PyTorch's CUDA allocator with one over the CachingManagedAllocator.
// Throws c10::Error if PyTorch's own CUDA allocator is already initialized.
void install_cuda_slot();

// Routes new CPU tensors through the CachingManagedAllocator (c10's CPU
// allocator slot). In a forked child, CPU tensors fall back to plain memory.
void install_cpu_slot();

}  // namespace torch_uvm
