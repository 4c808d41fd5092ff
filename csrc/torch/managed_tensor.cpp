#include "torch/managed_tensor.h"

#include <ATen/EmptyTensor.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include "torch/managed_allocator.h"
#include "torch/record_stream.h"
#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

void check_supported(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "torch_uvm.", what, ": the tensor is undefined");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided,
                    "torch_uvm.", what, ": only strided tensors can be managed, got layout ",
                    t.layout());
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.device().is_cuda(),
                    "torch_uvm.", what, ": only cpu and cuda tensors can be managed, got ",
                    t.device());
}

}  // namespace

std::optional<AllocationInfo> managed_allocation(const at::Tensor& t) {
  auto* a = allocator_if_created();
  if (a == nullptr || !t.defined() || !t.has_storage()) return std::nullopt;
  const void* data = t.storage().data();
  if (data == nullptr) return std::nullopt;
  return a->find_allocation(data);
}

bool is_managed(const at::Tensor& t) { return managed_allocation(t).has_value(); }

std::pair<const void*, std::size_t> tensor_span(const at::Tensor& t) {
  if (t.numel() == 0) return {t.data_ptr(), 0};
  int64_t extent = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    extent += (t.size(d) - 1) * std::abs(t.stride(d));
  }
  return {t.data_ptr(), static_cast<std::size_t>(extent) * t.element_size()};
}

c10::Storage storage_seen_on(const c10::Storage& source, at::Device target,
                             c10::Allocator* allocator, bool resizable) {
  auto* keep_alive = new c10::Storage(source);
  c10::DataPtr data(source.mutable_data(), keep_alive,
                    [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, target);
  return c10::Storage(c10::Storage::use_byte_size_t(), source.nbytes(), std::move(data),
                      allocator, resizable);
}

at::Tensor alias_on_device(const at::Tensor& t, at::Device target) {
  // Resizable through the target's managed allocator: a resize_ (or an out=
  // op) that must grow the alias gives it new managed storage of its own, as
  // PyTorch does whenever a storage is too small; from then on the alias and
  // the source no longer share memory. Shrinking or a resize within the
  // storage keeps the alias.
  c10::Storage storage = storage_seen_on(t.storage(), target, ManagedAllocator::for_device(target),
                                         /*resizable=*/true);
  c10::DispatchKeySet keys(target.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  // One version counter for both, as views share theirs: an in-place change
  // through either is seen by autograd in tensors saved from the other.
  // Inference tensors have none to share.
  const auto& counter = t.unsafeGetTensorImpl()->version_counter();
  if (counter.enabled() && !out.is_inference()) {
    out.unsafeGetTensorImpl()->set_version_counter(counter);
  }
  return out;
}

at::Tensor manage_memory(const at::Tensor& t) {
  check_supported(t, "manage_memory");
  c10::Device device = t.device();
  // With UVM off, PyTorch's allocator would not pass record_stream on.
  if (device.is_cuda() && !is_enabled()) register_record_stream_kernel();
  c10::OptionalDeviceGuard guard(device.is_cuda() ? std::optional<c10::Device>(device)
                                                  : std::nullopt);
  ManagedAllocator* alloc = ManagedAllocator::for_device(device);
  c10::DispatchKeySet keys(device.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU);
  at::Tensor out = at::detail::empty_strided_generic(t.sizes(), t.strides(), alloc, keys,
                                                     t.scalar_type());
  out.copy_(t);
  return out;
}

at::Tensor unmanage_memory(const at::Tensor& t) {
  check_supported(t, "unmanage_memory");
  at::Tensor out;
  if (t.device().is_cpu()) {
    out = at::detail::empty_strided_generic(t.sizes(), t.strides(), c10::GetDefaultCPUAllocator(),
                                            c10::DispatchKeySet(c10::DispatchKey::CPU),
                                            t.scalar_type());
  } else {
    TORCH_CHECK(!is_enabled(),
                "torch_uvm.unmanage_memory: with UVM on, every CUDA tensor comes from "
                "managed memory, so an unmanaged CUDA copy cannot be made. Use "
                "unmanage_memory on a CPU tensor, or run without UVM.");
    out = at::empty_strided(t.sizes(), t.strides(), t.options());
  }
  out.copy_(t);
  return out;
}

}  // namespace torch_uvm
