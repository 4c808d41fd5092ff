// Where a move becomes a prefetch.
//
// `t.to(device)` ends in aten::_to_copy. For a managed tensor whose move
// changes only the device, the kernel below returns a tensor of the new device
// over the same memory (alias_on_device), marks the allocation as used on the
// target's stream (so it is not reused while kernels there may read it) and
// schedules a prefetch that the target's stream waits for (from the CPU and
// non-blocking, a worker thread issues it: prefetch_advise.h); a move to the CPU then waits
// for the source's stream unless non_blocking. Anything else (a dtype, layout or memory format
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
#include <map>
#include <mutex>

#include "torch/managed_allocator.h"
#include "torch/managed_tensor.h"
#include "torch/prefetch_advise.h"
#include "torch/record_stream.h"
#include "torch/state.h"
#include "torch/trace_scope.h"
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

// GPU to GPU: the target's stream must not read before the work queued on
// the source GPU (which may still be writing the data) is done, as in
// PyTorch's cross-device copy. One event per source GPU serves every move:
// a wait takes the event's state when it is queued.
void wait_for_source(at::Device source, StreamRef target_stream) {
  static std::mutex mutex;
  static std::map<DeviceIndex, EventHandle> events;
  Runtime& rt = allocator().runtime();
  std::lock_guard<std::mutex> lock(mutex);
  EventHandle& ready = events[source.index()];
  if (ready == nullptr) ready = rt.create_event(source.index());
  rt.record_event(ready, current_stream_ref(source));
  rt.stream_wait_event(target_stream, ready);
}

at::Tensor move(const at::Tensor& self, at::Device target, bool non_blocking) {
  // With UVM off, PyTorch's allocator would not pass record_stream on.
  if (target.is_cuda() && !is_enabled()) register_record_stream_kernel();
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
  StreamRef stream = current_stream_ref(target.is_cuda() ? target : self.device());
  TraceScope scope("move", [&] { return self.device().str() + " to " + target.str(); }, bytes,
                   stream);
  translate_errors([&] {
    if (self.device().is_cuda() && target.is_cuda()) wait_for_source(self.device(), stream);
    if (target.is_cuda()) a.record_stream(self.storage().data(), stream);
    // No prefetch or advice during a graph capture: neither can be captured.
    if (bytes == 0 || !managed_hints_supported() || capture_underway()) return;
    if (g_move_advice) a.runtime().advise(ptr, bytes, Advice::kSetPreferredLocation, to_index(target));
    // From the CPU, nothing on a GPU may still be writing the pages: a
    // non-blocking move hands the prefetch to a worker and returns. A
    // blocking one issues it here: the data is ready sooner (table 3 of
    // benchmarks/results/2026-11-23-h100/run.md), and the caller asked to wait. Otherwise it is
    // ordered on `stream`.
    schedule_prefetch(ptr, bytes, to_index(target), stream,
                      /*off_thread=*/self.device().is_cpu() && non_blocking);
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
