#include "torch/forked_worker_memory.h"

#include "torch/state.h"

namespace torch_uvm {

void adopt_copy_in_forked_child(const at::Tensor& storage_owner, const at::Tensor& copy) {
  TORCH_CHECK(in_forked_child(),
              "torch_uvm: adopt_copy_in_forked_child is for a process made by fork() "
              "while UVM was on; this process was not.");
  c10::StorageImpl* impl = storage_owner.storage().unsafeGetStorageImpl();
  TORCH_CHECK(copy.device().is_cpu() && copy.is_contiguous() &&
                  copy.nbytes() >= impl->nbytes(),
              "torch_uvm: the copy for a forked worker must be a contiguous CPU tensor of at "
              "least ", impl->nbytes(), " bytes, got ", copy.nbytes(), " bytes on ",
              copy.device());
  auto* keep_alive = new c10::Storage(copy.storage());
  c10::DataPtr data(copy.data_ptr(), keep_alive,
                    [](void* ctx) { delete static_cast<c10::Storage*>(ctx); },
                    c10::Device(c10::kCPU));
  c10::DataPtr parents = impl->set_data_ptr(std::move(data));
  // The parent's managed memory is not mapped here; the parent frees it.
  (void)parents.release_context();
}

}  // namespace torch_uvm
