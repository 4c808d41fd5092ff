// Where a streamed tensor arrives on a GPU and leaves it.
//
// A streamed tensor (an offloaded weight, its gradient, an optimizer state)
// lives in its home: pinned host memory mapped for the GPU (pinned_home.h),
// which kernels can also read in place over PCIe. While its submodule runs
// it lives in a slot: device memory (slot_memory.h), filled from the home by
// a copy engine. A written slot goes home by a copy engine too. Both
// directions run at the link's speed at once and beside kernels (86 GB/s
// together on an H100), where managed memory on either side of a copy gave
// 51 together and the driver's migration of written pages to the CPU 9-18
// (benchmarks/results/2026-11-23-h100/mechanisms-uvm-*.log).
//
// The tensor the user's code holds never changes identity: its storage is
// pointed at the slot or at the home (point_at), so views of it, autograd's
// saved tensors and optimizers see the value wherever it is.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/runtime_event.h"
#include "torch/slot_memory.h"

namespace torch_uvm {

// How bytes cross the link: the copy engine (cudaMemcpyAsync), or a kernel
// that reads or writes the home's pages in place. Copy engines move pinned
// homes both ways at once beside kernels; a kernel copy holds SMs while it
// waits on PCIe (benchmarks/results/2026-11-23-h100/mechanisms-uvm-*.log, slot_both,
// contention).
enum class CopyBy { kCopyEngine = 0, kKernel = 1 };

struct CopyMechanisms {
  CopyBy to_gpu = CopyBy::kCopyEngine;
  CopyBy home = CopyBy::kCopyEngine;
};
// Process-wide; set_copy_mechanisms is for benchmarks comparing them.
CopyMechanisms copy_mechanisms();
void set_copy_mechanisms(CopyMechanisms m);

// Points `target`'s storage at `memory` (at least as many bytes), which it
// then keeps alive. Every tensor sharing target's storage sees the change.
void point_at(const at::Tensor& target, const c10::Storage& memory);

// A user's record_stream on a streamed tensor (its storage points at a slot
// or a home): the slot is kept from reuse until `stream` passes. False if
// `memory` is not a streamed tensor's.
bool record_stream_of_streamed(const c10::DataPtr& memory, c10::cuda::CUDAStream stream);

// `t` seen as a CPU tensor over the same memory where `t` is a streamed
// tensor at its pinned home, keeping the home alive; undefined otherwise.
// What a checkpoint saves, so that loading it never lands on the GPU.
// Copies home must have passed. (The home is live: written in place by
// later steps where it was given, replaced where the executor made it.)
at::Tensor home_on_cpu(const at::Tensor& t);

// Copies `bytes` from `src` to `dst` on `stream` by `by`; either side may be
// GPU memory or a home's pages.
void copy_bytes(void* dst, const void* src, std::size_t bytes, c10::Device device,
                c10::cuda::CUDAStream stream, CopyBy by);

class StreamedTensor {
 public:
  // `target`: a CUDA tensor at offset 0 of its own storage, whose memory is
  // either its home (pinned_home_copy's: an offloaded weight) or
  // GPU memory it already has (a new gradient, a new optimizer state),
  // which becomes its slot; a home is made when it first goes home.
  enum class Memory { kHome, kSlot };
  StreamedTensor(at::Tensor target, Memory memory);

  const at::Tensor& target() const { return target_; }
  std::size_t nbytes() const { return nbytes_; }
  bool in_slot() const { return static_cast<bool>(slot_); }
  bool has_home() const { return static_cast<bool>(home_); }
  const c10::Storage& home() const { return home_; }

  // Fills `slot` (device memory drawn for `stream`: slot_memory.h) from the
  // home on `stream` (after a copy home still under way) and points the
  // target at it. The caller records when it is ready.
  void bring(c10::cuda::CUDAStream stream, c10::Storage slot);
  // Its slot is in a share's arena (slot_memory.h).
  bool in_arena() const { return in_slot() && is_arena_slot(slot_); }
  // The GPU memory the target has now becomes its slot (a new target).
  void adopt();
  // Leaves the GPU: written, the slot is copied home on `home_stream` after
  // the work `done` marks (the compute streams'); the target points at the
  // home. A brought slot goes back to the allocator for its stream's next
  // slot, which that stream fills after `done` (once the copy home, if any,
  // has passed); an adopted one once `computes` and `home_stream` have
  // passed. Returns whether it was written home (also when `written` was
  // false but its home is another tensor's too, or it had none).
  bool leave(bool written, const StreamsPassed& done,
             const std::vector<c10::cuda::CUDAStream>& computes,
             c10::cuda::CUDAStream home_stream);
  // A new target of the same size (the next step's gradient) takes this
  // one's home; the old target keeps its value where it is.
  void retarget(at::Tensor target);
  // The target died (a gradient set to None): the slot goes back to the
  // allocator once `compute` has passed, nothing is written home, and
  // this holds no target until retarget.
  void abandon(const std::vector<c10::cuda::CUDAStream>& computes);
  bool has_target() const { return target_.defined(); }
  // Whoever still uses the slot (the target, if it lives on) keeps it; it
  // goes back to the allocator only once `streams` have passed.
  void let_go(const std::vector<c10::cuda::CUDAStream>& streams);
  // Whether the target was written since it was brought (its version
  // counter moved: an in-place op, load_state_dict, an optimizer step).
  bool changed() const;
  // Whether the target was written in place while at home (DDP's averaged
  // gradient, an accumulation): such writes run on a compute stream.
  bool written_at_home() const { return !in_slot() && has_home() && changed(); }
  // The event that says the slot is filled (shared by a bring's tensors).
  std::shared_ptr<RuntimeEvent> ready;

 private:
  void make_home();
  std::int64_t version() const;

  at::Tensor target_;
  std::size_t nbytes_;
  c10::Storage home_;
  c10::Storage slot_;           // defined while on the GPU
  // The stream a brought slot was drawn for (reused in its order); none
  // for memory adopted from the caller's allocator
  std::optional<c10::cuda::CUDAStream> slot_stream_;
  RuntimeEvent home_written_;   // the last copy home
  bool own_home_ = false;       // made here (a gradient's, a state's), not given
  std::int64_t version_ = 0;    // the target's version when brought, adopted or sent home
};

}  // namespace torch_uvm
