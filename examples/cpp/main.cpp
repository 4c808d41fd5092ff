// torch_uvm from C++: tensors in managed memory, moved between the CPU and
// the GPU without copies, a small model trained on them, and the allocator's
// statistics.
//
//   ./uvm_example                                  enables UVM itself
//   PYTORCH_ENABLE_UNIFIED_MEMORY=1 ./uvm_example  enabled when the library loads
//
// Exit status: 0 when every check passed, 2 without a GPU, 1 on a failed check.
#include <torch/torch.h>
#include <torch_uvm/torch_uvm.h>

#include <iostream>
#include <string>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok:   " : "FAIL: ") << what << "\n";
  if (!ok) ++failures;
}

int64_t stat(const std::string& key) {
  for (const auto& [k, v] : torch_uvm::memory_stats()) {
    if (k == key) return v;
  }
  return -1;
}

}  // namespace

int main() {
  std::cout << "enabled at load: " << (torch_uvm::is_enabled() ? "yes" : "no") << "\n";
  try {
    torch_uvm::enable();  // before the first CUDA tensor; a no-op if already on
  } catch (const c10::Error& e) {
    std::cout << "needs a GPU: " << e.what_without_backtrace() << "\n";
    return 2;
  }

  // New CPU tensors come from managed memory.
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({1024, 1024});
  check(torch_uvm::is_managed(x), "a new CPU tensor is managed");

  // .to(kCUDA) changes only the device: same memory, prefetched to the GPU.
  torch::Tensor on_gpu = x.to(torch::kCUDA);
  check(on_gpu.is_cuda() && on_gpu.data_ptr() == x.data_ptr(), "x.to(kCUDA) is zero-copy");
  torch::Tensor doubled = on_gpu * 2;  // computed on the GPU, result managed
  torch::Tensor back = doubled.to(torch::kCPU);
  check(back.data_ptr() == doubled.data_ptr(), "y.to(kCPU) is zero-copy");
  check(torch::equal(back, x * 2), "the GPU's result reads correctly on the CPU");

  // copy=true, or a dtype change, still copies.
  torch::Tensor copied =
      x.to(torch::TensorOptions().device(torch::kCUDA), /*non_blocking=*/false, /*copy=*/true);
  check(copied.data_ptr() != x.data_ptr(), "copy=true copies");

  // A small model trained on managed tensors.
  torch::nn::Sequential model(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 1));
  model->to(torch::kCUDA);
  torch::optim::SGD opt(model->parameters(), 0.05);
  torch::Tensor inputs = torch::randn({256, 64});
  torch::Tensor targets = inputs.sum(1, true);
  torch::Tensor in_gpu = inputs.to(torch::kCUDA), tgt_gpu = targets.to(torch::kCUDA);
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    torch::Tensor loss = torch::mse_loss(model->forward(in_gpu), tgt_gpu);
    opt.zero_grad();
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  std::cout << "loss: " << first << " -> " << last << "\n";
  check(last < first / 4, "training on managed memory reduces the loss");

  // Raw managed buffers, and the allocator's statistics.
  void* raw = torch_uvm::raw_alloc(1 << 20, torch::Device(torch::kCUDA));
  check(stat("allocated_bytes.all.current") >= (1 << 20), "raw_alloc is counted");
  torch_uvm::raw_free(raw);
  check(stat("num_device_alloc") > 0 && stat("reserved_bytes.all.current") > 0,
        "memory_stats() reports segments");
  std::cout << "reserved: " << stat("reserved_bytes.all.current") / (1 << 20) << " MiB in "
            << stat("segment.all.current") << " segments, cap "
            << torch_uvm::memory_cap() / (1 << 20) << " MiB\n";

  // Bad input is a c10::Error naming what to do.
  try {
    torch_uvm::raw_free(reinterpret_cast<void*>(0x1000));
    check(false, "freeing a foreign pointer throws");
  } catch (const c10::Error& e) {
    check(std::string(e.what_without_backtrace()).find("not a live allocation") != std::string::npos,
          "freeing a foreign pointer throws a c10::Error");
  }

  std::cout << (failures == 0 ? "all checks passed" : "checks FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}
