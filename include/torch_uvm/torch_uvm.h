// torch_uvm: unified (CUDA managed) memory for PyTorch. The public C++ API.
//
//   #include <torch_uvm/torch_uvm.h>
//   torch_uvm::enable();                       // before the first CUDA allocation
//   auto x = torch::randn({1024, 1024});       // managed, lives on the CPU
//   auto y = x.to(torch::kCUDA);               // same memory, prefetched to the GPU
//
// Every function throws c10::Error (c10::OutOfMemoryError when memory runs
// out) with a message naming what was wrong and what to do.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_uvm {

class CachingManagedAllocator;

// Routes new CPU and CUDA tensors through the CachingManagedAllocator.
// Must run before PyTorch's CUDA allocator is initialized (the first CUDA
// tensor or torch.cuda call). Enabling twice is a no-op.
void enable();
// UVM cannot be turned off once on (RFC-0023): this throws if it is on.
void disable();
bool is_enabled();
// Enables if PYTORCH_ENABLE_UNIFIED_MEMORY is set to a true value.
// Throws for a value that is not a boolean.
void enable_from_environment();

// Zero-copy device moves of managed tensors (default on).
void set_move_on_copy(bool on);
bool move_on_copy();
// Also set the preferred location on each move (default off: it costs ~16 ms
// per populated GiB, and the segment's advice plus a prefetch suffice).
void set_move_advice(bool on);
bool move_advice();
// Whether copies between managed CPU tensors and GPUs take the fast paths
// (default on): to a GPU, the source is prefetched there and copied on it;
// into a managed CPU tensor, large copies go through pinned buffers.
void set_fast_copy(bool on);
bool fast_copy();

bool is_managed(const at::Tensor& t);
// A managed copy with the same device, dtype, shape and strides.
at::Tensor manage_memory(const at::Tensor& t);
// An ordinary (unmanaged) copy.
at::Tensor unmanage_memory(const at::Tensor& t);
// `t.to(device)`, zero-copy for a managed tensor whatever move_on_copy says.
at::Tensor uvm_to(const at::Tensor& t, at::Device device, bool non_blocking = false);

// Migrates the pages under `t` to `device` (default: t's device), ordered on
// `stream` (default: the current stream of the device doing the work).
void prefetch(const at::Tensor& t, std::optional<at::Device> device = std::nullopt,
              std::optional<c10::Stream> stream = std::nullopt);
// advice: read_mostly, preferred_location, accessed_by, or unset_<advice>.
void advise(const at::Tensor& t, const std::string& advice,
            std::optional<at::Device> device = std::nullopt);

// Raw managed memory from the caching allocator, for buffers that are not
// tensors (c10::cuda::CUDACachingAllocator::raw_alloc's counterpart): `bytes`
// whose home is `device` (cpu or cuda[:N]), ordered on its current stream.
// raw_free throws for a pointer raw_alloc did not return.
void* raw_alloc(std::size_t bytes, at::Device device);
void raw_free(void* ptr);

// Statistics with the keys of torch.cuda.memory_stats().
std::vector<std::pair<std::string, int64_t>> memory_stats();
void empty_cache();
void reset_peak_memory_stats();
void reset_accumulated_memory_stats();
std::size_t memory_cap();
void set_memory_cap(std::size_t bytes, bool allow_oversubscription = false);

// The allocator itself (created on first use; needs a GPU).
CachingManagedAllocator& allocator();

}  // namespace torch_uvm
