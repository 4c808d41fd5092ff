// Where a move becomes a prefetch.
//
// `t.to(device)` ends in aten::_to_copy. For a managed tensor whose move
// changes only the device, the kernel below returns a tensor of the new device
// over the same memory (alias_on_device), marks the allocation as used on the
// target's stream (so it is not reused while kernels there may read it) and
// queues a prefetch on that stream; a move to the CPU then waits for the
// stream unless non_blocking. Anything else (a dtype, layout or memory format
// change, copy=True, set_move_on_copy(False)) copies as PyTorch does.
//
// _to_copy cannot see copy=True: aten::to drops it before calling _to_copy.
// So the aten::to overloads are wrapped too, only to note copy=True in a
// thread-local for the duration of the stock implementation.
//
// _to_copy's BackendSelect kernel sends a CPU tensor's .to('cuda') to the
// CUDA key, so both CPU and CUDA keys get the kernel.
#include <ATen/ATen.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/to_native.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>

#include "torch/managed_allocator.h"
#include "torch/managed_tensor.h"
#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

std::atomic<bool> g_move_on_copy{true};
std::atomic<bool> g_move_advice{false};
thread_local bool t_copy_requested = false;
thread_local bool t_force_move = false;

struct CopyRequest {
  explicit CopyRequest(bool copy) : saved(t_copy_requested) { t_copy_requested = copy; }
  ~CopyRequest() { t_copy_requested = saved; }
  bool saved;
};

// Whether this _to_copy may be served without a copy.
bool is_pure_move(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                  std::optional<at::Layout> layout, std::optional<at::Device> device,
                  std::optional<bool> pin_memory, std::optional<at::MemoryFormat> format) {
  if (t_copy_requested || !device.has_value()) return false;
  if (!(g_move_on_copy || t_force_move)) return false;
  at::Device target = with_index(*device);
  if (target == self.device()) return false;
  if (!(target.is_cpu() || target.is_cuda())) return false;
  if (dtype.has_value() && *dtype != self.scalar_type()) return false;
  if (layout.has_value() && *layout != at::kStrided) return false;
  if (self.layout() != at::kStrided || self.is_conj() || self.is_neg()) return false;
  if (pin_memory.value_or(false)) return false;
  if (format.has_value() && *format != at::MemoryFormat::Preserve &&
      !self.is_contiguous(*format)) {
    return false;
  }
  return is_managed(self);
}

at::Tensor move(const at::Tensor& self, at::Device target, bool non_blocking) {
  if (target.is_cuda()) {
    int count = c10::cuda::device_count();
    TORCH_CHECK_INDEX(target.index() < count, "torch_uvm: cannot move a tensor to ", target,
                      "; this machine has ", count, " CUDA device(s)");
  }
  at::Tensor out = alias_on_device(self, target);
  auto [ptr, bytes] = tensor_span(self);
  CachingManagedAllocator& a = allocator();
  // Work on a GPU is ordered on that GPU's current stream; a move to the CPU
  // is ordered after the work queued on the source GPU.
  at::Device worker = target.is_cuda() ? target : self.device();
  StreamRef stream = current_stream_ref(worker);
  if (self.device().is_cuda() && target.is_cuda()) {
    // GPU to GPU: the target's stream must not read before the work queued
    // on the source GPU (which may still be writing the data) is done, as in
    // PyTorch's cross-device copy.
    translate_errors([&] {
      Runtime& rt = a.runtime();
      EventHandle ready = rt.create_event(self.device().index());
      rt.record_event(ready, current_stream_ref(self.device()));
      rt.stream_wait_event(current_stream_ref(target), ready);
      rt.destroy_event(ready);  // released by the driver once it has fired
    });
  }
  if (bytes == 0 || !managed_hints_supported()) return out;
  translate_errors([&] {
    if (target.is_cuda()) a.record_stream(self.storage().data(), stream);
    DeviceIndex to = target.is_cpu() ? kCpuDevice : target.index();
    if (g_move_advice) a.runtime().advise(ptr, bytes, Advice::kSetPreferredLocation, to);
    a.runtime().prefetch(ptr, bytes, to, stream);
  });
  if (target.is_cpu() && !non_blocking) {
    c10::cuda::getCurrentCUDAStream(self.device().index()).synchronize();
  }
  return out;
}

at::Tensor to_copy_kernel(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                          std::optional<at::Layout> layout, std::optional<at::Device> device,
                          std::optional<bool> pin_memory, bool non_blocking,
                          std::optional<at::MemoryFormat> format) {
  if (is_pure_move(self, dtype, layout, device, pin_memory, format)) {
    return move(self, with_index(*device), non_blocking);
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, format);
}

at::Tensor to_dtype_layout(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout, std::optional<at::Device> device,
                           std::optional<bool> pin_memory, bool non_blocking, bool copy,
                           std::optional<at::MemoryFormat> format) {
  CopyRequest request(copy);
  return at::native::to(self, dtype, layout, device, pin_memory, non_blocking, copy, format);
}

at::Tensor to_device(const at::Tensor& self, at::Device device, at::ScalarType dtype,
                     bool non_blocking, bool copy, std::optional<at::MemoryFormat> format) {
  CopyRequest request(copy);
  return at::native::to(self, device, dtype, non_blocking, copy, format);
}

at::Tensor to_other(const at::Tensor& self, const at::Tensor& other, bool non_blocking,
                    bool copy, std::optional<at::MemoryFormat> format) {
  CopyRequest request(copy);
  return at::native::to(self, other, non_blocking, copy, format);
}

void register_to_wrappers(torch::Library& m) {
  m.impl("to.dtype_layout", TORCH_FN(to_dtype_layout));
  m.impl("to.device", TORCH_FN(to_device));
  m.impl("to.other", TORCH_FN(to_other));
}

}  // namespace

void set_move_on_copy(bool on) { g_move_on_copy = on; }
bool move_on_copy() { return g_move_on_copy; }
void set_move_advice(bool on) { g_move_advice = on; }
bool move_advice() { return g_move_advice; }

at::Tensor uvm_to(const at::Tensor& t, at::Device device, bool non_blocking) {
  bool saved = t_force_move;
  t_force_move = true;
  struct Restore {
    bool v;
    ~Restore() { t_force_move = v; }
  } restore{saved};
  return t.to(device, non_blocking);
}

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_to_copy", TORCH_FN(to_copy_kernel));
  register_to_wrappers(m);
}
TORCH_LIBRARY_IMPL(aten, CUDA, m) {
  m.impl("_to_copy", TORCH_FN(to_copy_kernel));
  register_to_wrappers(m);
}
TORCH_LIBRARY_IMPL(aten, AutogradCPU, m) { register_to_wrappers(m); }
TORCH_LIBRARY_IMPL(aten, AutogradCUDA, m) { register_to_wrappers(m); }

}  // namespace torch_uvm
