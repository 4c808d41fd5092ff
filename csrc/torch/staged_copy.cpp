// Where a copy to the CPU goes through pinned buffers.
//
// PyTorch copies a GPU tensor into pageable memory, managed memory among it,
// at 11-13 GB/s on an H100: the driver stages it. Copied into pinned memory
// instead, the same bytes arrive at 55 GB/s, and a CPU copy out of a pinned
// buffer into pages the CPU already holds runs at tens of GB/s. Pipelined in
// 16 MiB pieces (the GPU fills one buffer while the CPU empties the other),
// the whole copy runs at 36 GB/s for 1 GiB (benchmarks/results/
// 2026-11-23-h100/mechanisms-copies.md, copy_d2h rows).
//
// The copy is ordered after the work queued on the source GPU's current
// stream, and returns when the data is in `dst`, as PyTorch's copy into
// pageable memory does. The pieces' copies and events are the runtime's.
#include "torch/staged_copy.h"

#include <ATen/ops/copy_native.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>

#include "torch/managed_allocator.h"
#include "torch/state.h"
#include "torch/trace_scope.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

// Two events of the runtime's, destroyed however the copy ends.
struct Events {
  Runtime& rt;
  std::array<EventHandle, 2> e{};
  explicit Events(Runtime& runtime) : rt(runtime) {}
  void create(DeviceIndex device) {  // after construction: a throw here is cleaned up
    for (auto& x : e) x = rt.create_event(device);
  }
  ~Events() {
    for (auto x : e) {
      if (x == nullptr) continue;
      try {
        rt.synchronize_event(x);  // no copy may still write a buffer
        rt.destroy_event(x);
      } catch (...) {
      }
    }
  }
};

}  // namespace

void staged_copy_to_cpu(at::Tensor& dst, const at::Tensor& src) {
  TORCH_INTERNAL_ASSERT(dst.is_cpu() && src.is_cuda() && dst.is_contiguous());
  c10::cuda::CUDAGuard guard(src.device());
  const at::Tensor from = src.contiguous();   // a GPU copy if it was not
  at::Tensor to = dst.view({-1});
  const std::size_t total = static_cast<std::size_t>(dst.nbytes());
  const std::size_t piece = std::min(kStagedPieceBytes, total);
  // The host allocator caches pinned blocks: after the first copy these
  // cost no cudaHostAlloc.
  std::array<at::Tensor, 2> buffer;
  for (auto& b : buffer) {
    b = at::empty({static_cast<int64_t>(piece)}, dst.options().dtype(at::kByte).pinned_memory(true));
  }
  at::Tensor bytes = to.view(at::kByte);
  const char* source = static_cast<const char*>(from.const_data_ptr());
  const StreamRef stream = current_stream_ref(src.device());
  TraceScope scope("staged_copy", [&] { return src.device().str() + " to cpu"; }, total, stream);
  translate_errors([&] {
    Runtime& rt = allocator().runtime();
    Events filled(rt);
    filled.create(to_index(src.device()));
    auto drain = [&](std::size_t i) {  // the CPU copies piece i out of its buffer
      const std::size_t start = i * piece, len = std::min(piece, total - start);
      rt.synchronize_event(filled.e[i % 2]);
      at::Tensor into = bytes.narrow(0, start, len);
      at::native::copy_(into, buffer[i % 2].narrow(0, 0, len), false);
    };
    const std::size_t pieces = (total + piece - 1) / piece;
    try {
      for (std::size_t i = 0; i < pieces; ++i) {
        // buffer[i % 2] held piece i - 2, which drain(i - 2) emptied
        const std::size_t start = i * piece, len = std::min(piece, total - start);
        rt.copy(buffer[i % 2].data_ptr(), source + start, len, stream, /*synchronous=*/false,
                CopyKind::kAny);
        rt.record_event(filled.e[i % 2], stream);
        if (i > 0) drain(i - 1);
      }
      drain(pieces - 1);
    } catch (...) {
      // no copy may still write a buffer when it goes back to the host cache
      try {
        rt.synchronize_stream(stream);
      } catch (...) {
      }
      throw;
    }
  });
}

}  // namespace torch_uvm
