#include "torch/streamed_tensor.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>

#include "torch/managed_tensor.h"
#include "torch/pinned_home.h"
#include "torch/slot_memory.h"
#include "torch/state.h"
#include "torch/stream_ref.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

std::atomic<int> g_to_gpu{static_cast<int>(CopyBy::kCopyEngine)};
std::atomic<int> g_home{static_cast<int>(CopyBy::kCopyEngine)};

void release_storage(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

// The widest integer both addresses and the size are aligned to: a kernel
// copy as a bitwise op on it moves every bit pattern unchanged.
at::ScalarType word(const void* a, const void* b, std::size_t bytes) {
  const auto bits = reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b) |
                    static_cast<std::uintptr_t>(bytes);
  if (bits % 8 == 0) return at::kLong;
  if (bits % 4 == 0) return at::kInt;
  if (bits % 2 == 0) return at::kShort;
  return at::kByte;
}

at::Tensor words(void* p, std::size_t bytes, at::ScalarType t, c10::Device device) {
  const auto count = static_cast<int64_t>(bytes / c10::elementSize(t));
  return at::for_blob(p, {count})
      .options(at::TensorOptions().dtype(t).device(device))
      .target_device(device)
      .make_tensor();
}

// The memory `target`'s storage has now, as a storage of its own (target's
// storage is left empty: point_at it next).
c10::Storage take_memory(const at::Tensor& target) {
  c10::StorageImpl* impl = target.storage().unsafeGetStorageImpl();
  const std::size_t bytes = impl->nbytes();
  c10::DataPtr owned = impl->set_data_ptr(c10::DataPtr(nullptr, target.device()));
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(owned),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

}  // namespace

CopyMechanisms copy_mechanisms() {
  return {static_cast<CopyBy>(g_to_gpu.load()), static_cast<CopyBy>(g_home.load())};
}

void set_copy_mechanisms(CopyMechanisms m) {
  g_to_gpu = static_cast<int>(m.to_gpu);
  g_home = static_cast<int>(m.home);
}

at::Tensor home_on_cpu(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return {};
  // Only a home a streamed tensor points at: one not yet taken over (a
  // state just loaded) has its memory moved out of its storage when it is
  // (take_memory), and an alias holding that storage would dangle.
  const c10::DataPtr& memory = t.storage().data_ptr();
  if (memory.get_deleter() != &release_storage) return {};
  const c10::Storage home = *static_cast<const c10::Storage*>(memory.get_context());
  if (!is_pinned_home(home.data_ptr())) return {};
  c10::Storage seen = storage_seen_on(home, c10::Device(c10::kCPU), /*allocator=*/nullptr,
                                      /*resizable=*/false);
  return at::empty({0}, t.options().device(c10::kCPU))
      .set_(seen, t.storage_offset(), t.sizes(), t.strides());
}

bool record_stream_of_streamed(const c10::DataPtr& memory, c10::cuda::CUDAStream stream) {
  if (memory.get_deleter() != &release_storage) return false;
  const auto& now = *static_cast<const c10::Storage*>(memory.get_context());
  if (!is_pinned_home(now.data_ptr())) record_slot_stream(now, stream);  // a home stays
  return true;
}

void point_at(const at::Tensor& target, const c10::Storage& memory) {
  c10::StorageImpl* impl = target.storage().unsafeGetStorageImpl();
  TORCH_INTERNAL_ASSERT(memory.nbytes() >= impl->nbytes(), "torch_uvm: a streamed tensor's ",
                        "memory is smaller than its storage");
  auto* keep = new c10::Storage(memory);
  impl->set_data_ptr_noswap(
      c10::DataPtr(memory.unsafeGetStorageImpl()->mutable_data(), keep, &release_storage,
                   target.device()));
}

void copy_bytes(void* dst, const void* src, std::size_t bytes, c10::Device device,
                c10::cuda::CUDAStream stream, CopyBy by) {
  if (bytes == 0) return;
  if (by == CopyBy::kCopyEngine) {
    translate_errors([&] {  // a home is host memory: the runtime tells which way
      allocator().runtime().copy(dst, src, bytes, stream_ref(stream), /*synchronous=*/false,
                                 CopyKind::kAny);
    });
    return;
  }
  const at::ScalarType t = word(dst, src, bytes);
  c10::cuda::CUDAStreamGuard guard(stream);
  at::Tensor out = words(dst, bytes, t, device);
  at::bitwise_or_out(out, words(const_cast<void*>(src), bytes, t, device), 0);
}

StreamedTensor::StreamedTensor(at::Tensor target, Memory memory)
    : target_(std::move(target)),
      nbytes_(target_.storage().nbytes()),
      home_written_(allocator().runtime()) {
  TORCH_CHECK(target_.is_cuda() && target_.storage_offset() == 0,
              "torch_uvm: a streamed tensor must be a CUDA tensor at the start of its storage");
  if (memory == Memory::kSlot) {
    adopt();
    return;
  }
  TORCH_CHECK(is_pinned_home(target_.storage().data_ptr()),
              "torch_uvm: a streamed tensor's home must be pinned host memory (pinned_home)");
  home_ = take_memory(target_);
  point_at(target_, home_);
  version_ = version();
}

std::int64_t StreamedTensor::version() const {
  if (!target_.defined()) return 0;
  const auto& counter = target_.unsafeGetTensorImpl()->version_counter();
  return counter.enabled() ? static_cast<std::int64_t>(counter.current_version()) : 0;
}

bool StreamedTensor::changed() const { return version() != version_; }

void StreamedTensor::make_home() {
  home_ = make_pinned_home(nbytes_, target_.device());
  own_home_ = true;
}

void StreamedTensor::bring(c10::cuda::CUDAStream stream, c10::Storage slot) {
  if (in_slot()) return;
  TORCH_INTERNAL_ASSERT(has_home(), "torch_uvm: a streamed tensor has no home to come from");
  TORCH_INTERNAL_ASSERT(slot.nbytes() >= nbytes_, "torch_uvm: a slot smaller than its tensor");
  home_written_.block(stream_ref(stream));
  // (a copy that fails leaves no slot: the next bring copies again)
  copy_bytes(slot.mutable_data(), home_.data(), nbytes_, target_.device(), stream,
             copy_mechanisms().to_gpu);
  slot_ = std::move(slot);  // `stream`'s, first
  slot_stream_ = stream;
  point_at(target_, slot_);
  version_ = version();
}

void StreamedTensor::adopt() {
  if (in_slot()) return;
  slot_ = take_memory(target_);
  slot_stream_.reset();  // the caller's allocator's, for the caller's stream
  point_at(target_, slot_);
  version_ = version();
}

bool StreamedTensor::leave(bool written, const StreamsPassed& done,
                           const std::vector<c10::cuda::CUDAStream>& computes,
                           c10::cuda::CUDAStream home_stream) {
  if (!in_slot()) return false;
  // A home another tensor still reads (an earlier step's gradient the user
  // kept) is not overwritten: this one gets its own.
  if (!has_home() || (own_home_ && home_.use_count() > 1)) {
    make_home();
    written = true;
  }
  if (written) {
    done.block(stream_ref(home_stream));
    copy_bytes(home_.mutable_data(), slot_.data(), nbytes_, target_.device(), home_stream,
               copy_mechanisms().home);
    home_written_.record(stream_ref(home_stream));
  }
  // A copy home is waited for by the allocator, not by a stream: the bring
  // stream would otherwise wait for every copy home, and the link's two
  // directions would take turns.
  if (written) record_slot_stream(slot_, home_stream);
  if (slot_stream_) {
    // Reused in stream order: the next slot drawn for the stream that
    // filled this one is filled after the kernels that read it. Kept from
    // reuse until the compute stream passes instead, a slot's memory would
    // wait for the host to see it pass, and a host running ahead of the GPU
    // would draw new memory meanwhile: the GPU would hold more than the
    // budget.
    done.block(stream_ref(*slot_stream_));
  } else {
    for (const auto& c : computes) record_slot_stream(slot_, c);
  }
  point_at(target_, home_);
  slot_ = c10::Storage();
  version_ = version();
  return written;
}

void StreamedTensor::retarget(at::Tensor target) {
  TORCH_CHECK(target.is_cuda() && target.storage_offset() == 0 &&
                  target.storage().nbytes() == nbytes_,
              "torch_uvm: a streamed tensor's new target must be a CUDA tensor of ", nbytes_,
              " bytes at the start of its storage");
  TORCH_INTERNAL_ASSERT(!in_slot(), "torch_uvm: retarget while on the GPU");
  target_ = std::move(target);
  version_ = version();
}

void StreamedTensor::let_go(const std::vector<c10::cuda::CUDAStream>& streams) {
  if (!in_slot()) return;
  for (const auto& s : streams) record_slot_stream(slot_, s);
  slot_ = c10::Storage();
}

void StreamedTensor::abandon(const std::vector<c10::cuda::CUDAStream>& computes) {
  if (in_slot()) {
    for (const auto& c : computes) record_slot_stream(slot_, c);
  }
  slot_ = c10::Storage();
  target_ = at::Tensor();
}

}  // namespace torch_uvm
