// The CUDA allocator slot: torch_uvm's CudaAllocator (cuda_allocator.h)
// becomes PyTorch's CUDA allocator, both where torch.cuda reaches it
// (c10::cuda::CUDACachingAllocator::get()) and where torch.accelerator does
// (c10::GetAllocator(kCUDA)). PyTorch allows swapping its CUDA allocator only
// before the first one is initialized, so install() checks that first and
// says how to fix the order if it is too late.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "torch/cuda_allocator.h"
#include "torch/slot_memory.h"
#include "torch/slots.h"
#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {

void install_cuda_slot() {
  auto current = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(current == nullptr || !current->initialized(),
              "torch_uvm: PyTorch's CUDA allocator is already initialized (a CUDA "
              "tensor was created, or torch.cuda was initialized), so it can no "
              "longer be replaced. Enable UVM first: call "
              "torch_uvm.set_enabled_uvm(True) at the top of the program, or set "
              "PYTORCH_ENABLE_UNIFIED_MEMORY=1 before it starts.");
  // PyTorch's own stays, for streamed tensors' slots of device memory.
  if (current != nullptr) set_native_cuda_allocator(current);
  auto cuda = std::make_shared<CudaAllocator>(allocator());
  CudaAllocator::set_instance(cuda.get());
  // Keeps `cuda` alive for the process (PyTorch holds the shared_ptr).
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(cuda);
  // Above the priority PyTorch registers its own with.
  c10::SetAllocator(c10::kCUDA, cuda.get(), /*priority=*/100);
}

}  // namespace torch_uvm
