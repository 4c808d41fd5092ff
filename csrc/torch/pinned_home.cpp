#include "torch/pinned_home.h"

#include <c10/util/Exception.h>

#include "torch/managed_tensor.h"
#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

void free_home(void* ptr) {
  try {
    allocator().runtime().free_host(ptr);
  } catch (...) {  // a deleter must not throw; the memory is lost at worst
  }
}

}  // namespace

c10::Storage make_pinned_home(std::size_t bytes, c10::Device device) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "torch_uvm: a home is seen on a GPU");
  void* p = nullptr;
  translate_errors([&] { p = allocator().runtime().allocate_host(bytes == 0 ? 1 : bytes); });
  TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "torch_uvm: cannot pin ", bytes,
                   " bytes of host memory for a streamed tensor's home: the host is out of "
                   "memory it can pin (see ulimit -l). Free host memory, or offload less");
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes, c10::DataPtr(p, p, &free_home, device),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

bool is_pinned_home(const c10::DataPtr& memory) { return memory.get_deleter() == &free_home; }

at::Tensor pinned_home_empty(const at::Tensor& like, c10::Device device) {
  const auto nbytes = static_cast<std::size_t>(like.numel()) * like.element_size();
  c10::Storage home = make_pinned_home(nbytes, device);
  return at::empty({0}, like.options().device(device)).set_(home, 0, like.sizes());
}

at::Tensor pinned_home_copy(const at::Tensor& t, c10::Device device) {
  at::Tensor home = pinned_home_empty(t, device);
  // filled on the CPU: the home is host memory
  at::from_blob(home.data_ptr(), t.sizes(), t.options().device(c10::kCPU)).copy_(t.cpu());
  return home;
}

at::Tensor fresh_home_on_cpu(const at::Tensor& home) {
  TORCH_CHECK_VALUE(home.defined() && home.has_storage() &&
                        is_pinned_home(home.storage().data_ptr()),
                    "torch_uvm: fresh_home_on_cpu expects a tensor over a pinned home");
  c10::Storage seen = storage_seen_on(home.storage(), c10::Device(c10::kCPU),
                                      /*allocator=*/nullptr, /*resizable=*/false);
  return at::empty({0}, home.options().device(c10::kCPU))
      .set_(seen, home.storage_offset(), home.sizes(), home.strides());
}

}  // namespace torch_uvm
