// Tensor.record_stream for managed tensors made while UVM is off
// (manage_memory() of a CUDA tensor, or a move of one). Their memory is
// torch_uvm's, but PyTorch's own CUDA allocator is installed, and it ignores
// a pointer it does not own: torch_uvm would never learn of the other stream
// and could reuse the block while that stream still reads it. So
// aten::record_stream on CUDA tells torch_uvm first; everything else goes to
// PyTorch's kernel, which with UVM on reaches torch_uvm's CudaAllocator.
//
// The kernel is registered when the first such tensor is made (replacing a
// kernel makes PyTorch print a warning, which users who never need this
// should not see).
#include <ATen/ATen.h>
#include <ATen/ops/record_stream_native.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <mutex>

#include "torch/record_stream.h"
#include "torch/state.h"
#include "torch/stream_ref.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

void record_stream_kernel(at::Tensor& self, c10::Stream stream) {
  auto* a = allocator_if_created();
  if (a != nullptr && !is_enabled() && self.has_storage() && self.storage().data() != nullptr &&
      stream.device_type() == c10::kCUDA) {
    const void* data = self.storage().data();
    if (a->find_allocation(data)) {
      c10::cuda::CUDAStream cuda(stream);
      translate_errors([&] {
        a->record_stream(data, stream_ref(cuda));
      });
      return;
    }
  }
  at::native::record_stream_cuda(self, stream);
}

}  // namespace

void register_record_stream_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the process's life: the registration ends with the object.
    static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::CUDA, __FILE__, __LINE__);
    library->impl("record_stream", TORCH_FN(record_stream_kernel));
  });
}

}  // namespace torch_uvm
