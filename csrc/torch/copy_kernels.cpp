// Where a copy between a managed CPU tensor and a GPU takes its fast path.
//
// To the GPU, the source is prefetched. `gpu.copy_(cpu)` from a managed CPU
// tensor (load_state_dict into a GPU model; `.to('cuda', dtype)`, which ends
// in a copy_) is, in PyTorch, a copy-engine copy from pageable memory: from
// managed pages on the CPU, 7.3 GB/s on an H100, against 47 for a migrating
// prefetch. So the source's pages are prefetched to the destination's GPU,
// ordered on its current stream, and the copy (and any dtype conversion) runs
// on that GPU, from the same memory seen as a tensor of that device. The
// source's pages stay on the GPU afterwards, as after any GPU read of managed
// memory; a CPU access brings them back.
//
// To the CPU, a large copy into a managed CPU tensor goes through pinned
// buffers (staged_copy.h): 36 GB/s against PyTorch's 13 for 1 GiB.
//
// Measured: benchmarks/results/2026-11-23-h100/mechanisms-copies.md, copy_h2d and copy_d2h.
// As PyTorch's copies from and to pageable memory do, a blocking copy returns
// when the data is copied, so the caller may write the source at once.
// set_fast_copy(false) leaves every copy to PyTorch.
#include <ATen/ATen.h>
#include <ATen/ops/copy_native.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>

#include "torch/managed_allocator.h"
#include "torch/managed_tensor.h"
#include "torch/prefetch_advise.h"
#include "torch/staged_copy.h"
#include "torch/state.h"
#include "torch/trace_scope.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

std::atomic<bool> g_fast_copy{true};

// Below this PyTorch copies: measured faster both ways from 4 MiB
// (benchmarks/results/2026-11-23-h100/run.md, table 4b), and a prefetch of a small
// tensor would move the pages it shares with its neighbours.
constexpr std::size_t kFastCopyMinBytes = 4u << 20;

bool plain(const at::Tensor& t) {
  return t.layout() == at::kStrided && !t.is_conj() && !t.is_neg();
}

bool large(const at::Tensor& t) {
  return static_cast<std::size_t>(t.nbytes()) >= kFastCopyMinBytes;
}

// Whether the bytes the two tensors span meet. A moved tensor shares its
// source's memory under another storage, so PyTorch's own overlap checks
// (which compare storages) cannot see it; such copies are left to PyTorch,
// which copies through a temporary where it must.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  auto [pa, na] = tensor_span(a);
  auto [pb, nb] = tensor_span(b);
  auto* x = static_cast<const char*>(pa);
  auto* y = static_cast<const char*>(pb);
  return x < y + nb && y < x + na;
}

// A large copy from a managed CPU tensor into GPU memory, with hints
// available. A moved CPU tensor (a model built on the CPU, then .cuda()) is
// a destination like any other. Where the target GPU streams under a
// residency budget (a limit, or an offload's share), a destination homed on
// the CPU (an offloaded weight's home, a streamed batch) is left to PyTorch:
// prefetching the source would bring it to the GPU outside the budget.
bool prefetches(const at::Tensor& self, const at::Tensor& src) {
  if (!g_fast_copy || !self.is_cuda() || !src.is_cpu()) return false;
  if (!large(src) || !plain(self) || !plain(src)) return false;
  if (!managed_hints_supported() || capture_underway()) return false;
  if (!is_managed(src) || overlap(self, src)) return false;
  if (!residency_budget().has_budget(self.device().index())) return true;
  auto home = managed_allocation(self);
  return !home.has_value() || home->home != kCpuDevice;
}

// A large copy from a GPU into a managed CPU tensor, element for element.
bool stages(const at::Tensor& self, const at::Tensor& src) {
  if (!g_fast_copy || !self.is_cpu() || !src.is_cuda()) return false;
  if (self.scalar_type() != src.scalar_type() || self.sizes() != src.sizes()) return false;
  if (!plain(self) || !plain(src) || !self.is_contiguous()) return false;
  if (!large(self) || capture_underway() || overlap(self, src)) return false;
  return is_managed(self);
}

at::Tensor& copy_kernel(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (stages(self, src)) {
    staged_copy_to_cpu(self, src);
    return self;
  }
  if (!prefetches(self, src)) return at::native::copy_(self, src, non_blocking);
  const at::Device target = self.device();
  auto [ptr, bytes] = tensor_span(src);
  StreamRef stream = current_stream_ref(target);
  TraceScope scope("prefetched_copy", [&] { return "to " + target.str(); }, bytes, stream);
  translate_errors([&] {
    // The source's block is read on `stream`: it is not reused before that.
    allocator().record_stream(src.storage().data(), stream);
    schedule_prefetch(ptr, bytes, to_index(target), stream, /*off_thread=*/false);
  });
  at::native::copy_(self, alias_on_device(src, target), non_blocking);
  if (!non_blocking) c10::cuda::getCurrentCUDAStream(target.index()).synchronize();
  return self;
}

}  // namespace

void set_fast_copy(bool on) { g_fast_copy = on; }
bool fast_copy() { return g_fast_copy; }

// copy_ dispatches on both tensors' keys: a CPU-to-GPU copy reaches the CUDA
// kernel. Both keys get it, so a registration order cannot matter.
TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("copy_", TORCH_FN(copy_kernel)); }
TORCH_LIBRARY_IMPL(aten, CUDA, m) { m.impl("copy_", TORCH_FN(copy_kernel)); }

}  // namespace torch_uvm
