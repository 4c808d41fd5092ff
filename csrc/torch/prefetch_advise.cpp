// Explicit hints: prefetch() and advise() on a managed tensor's pages.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include "torch/managed_allocator.h"
#include "torch/managed_tensor.h"
#include "torch/prefetch_advise.h"
#include "torch/state.h"
#include "torch/trace_scope.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

AllocationInfo require_managed(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "torch_uvm.", what, ": the tensor is undefined");
  auto info = managed_allocation(t);
  TORCH_CHECK_VALUE(info.has_value(), "torch_uvm.", what,
                    ": the tensor is not managed. Create it with UVM on "
                    "(torch_uvm.set_enabled_uvm(True)) or call t.manage_memory() first.");
  return *info;
}

void check_device(at::Device device, const char* what) {
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(), "torch_uvm.", what,
                    ": managed memory lives on cpu or cuda devices, not ", device);
  if (device.is_cuda()) {
    int count = c10::cuda::device_count();
    TORCH_CHECK_INDEX(device.has_index() && device.index() >= 0 && device.index() < count,
                      "torch_uvm.", what, ": ", device, " does not exist; this machine has ",
                      count, " CUDA device(s)");
  }
}

}  // namespace

// Up to one large page, the driver call costs ~0.05 ms and the hand-off to
// the worker adds more to the time until the data is ready than it saves
// (benchmarks/results/2026-11-23-h100/run.md, table 3, 1 MiB rows): such prefetches stay inline.
constexpr std::size_t kOffThreadMinBytes = 2u << 20;

void schedule_prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                       StreamRef stream, bool off_thread) {
  report_prefetch_errors();
  if (off_thread && bytes > kOffThreadMinBytes && target != kCpuDevice &&
      stream.device == target) {
    if (PrefetchQueue* q = prefetch_queue(); q && q->submit(ptr, bytes, target, stream)) return;
  }
  allocator().runtime().prefetch(ptr, bytes, target, stream);
}

void prefetch(const at::Tensor& t, std::optional<at::Device> device,
              std::optional<c10::Stream> stream) {
  require_managed(t, "prefetch");
  at::Device target = with_index(device.value_or(t.device()));
  check_device(target, "prefetch");
  if (!managed_hints_supported()) return;
  StreamRef ref;
  if (stream.has_value()) {
    TORCH_CHECK_VALUE(stream->device_type() == at::kCUDA,
                      "torch_uvm.prefetch: stream must be a CUDA stream, got ", *stream);
    ref = {stream->device_index(),
           reinterpret_cast<std::uintptr_t>(c10::cuda::CUDAStream(*stream).stream())};
  } else {
    // The GPU that will use the data, or for the CPU, the current GPU.
    ref = current_stream_ref(target.is_cuda() ? target : with_index(at::Device(at::kCUDA)));
  }
  auto [ptr, bytes] = tensor_span(t);
  if (bytes == 0) return;
  // Explicit prefetches leave the caller's thread too: the stream still
  // waits for them.
  if (capture_underway()) return;
  TraceScope scope("prefetch", [&] { return "to " + target.str(); }, bytes, ref);
  translate_errors([&] { schedule_prefetch(ptr, bytes, to_index(target), ref, true); });
}

void advise(const at::Tensor& t, const std::string& advice, std::optional<at::Device> device) {
  require_managed(t, "advise");
  static const std::pair<const char*, Advice> names[] = {
      {"read_mostly", Advice::kSetReadMostly},
      {"unset_read_mostly", Advice::kUnsetReadMostly},
      {"preferred_location", Advice::kSetPreferredLocation},
      {"unset_preferred_location", Advice::kUnsetPreferredLocation},
      {"accessed_by", Advice::kSetAccessedBy},
      {"unset_accessed_by", Advice::kUnsetAccessedBy},
  };
  const Advice* chosen = nullptr;
  for (const auto& [name, value] : names) {
    if (advice == name) chosen = &value;
  }
  TORCH_CHECK_VALUE(chosen != nullptr, "torch_uvm.advise: unknown advice '", advice,
                    "'. Use one of: read_mostly, preferred_location, accessed_by, "
                    "unset_read_mostly, unset_preferred_location, unset_accessed_by.");
  at::Device target = with_index(device.value_or(t.device()));
  check_device(target, "advise");
  TORCH_CHECK_VALUE(!(target.is_cpu() && (*chosen == Advice::kSetAccessedBy ||
                                          *chosen == Advice::kUnsetAccessedBy)),
                    "torch_uvm.advise: accessed_by names the GPU that reads the memory; "
                    "pass a cuda device, not cpu");
  if (!managed_hints_supported()) return;
  auto [ptr, bytes] = tensor_span(t);
  if (bytes == 0) return;
  TraceScope scope("advise", [&] { return advice + " " + target.str(); }, bytes);
  translate_errors([&] { allocator().runtime().advise(ptr, bytes, *chosen, to_index(target)); });
}

}  // namespace torch_uvm
