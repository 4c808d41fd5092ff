// torch_uvm's own work in profiler traces: a range named "torch_uvm::<what>
// <subject>" (a submodule's or a tensor's name), with its bytes and the
// stream its copies run on as arguments. It shows in torch.profiler traces
// (export_chrome_trace, TensorBoard), where the copies it queues are linked
// to it, and, under torch.autograd.profiler.emit_nvtx, as an NVTX range in
// Nsight Systems. With no profiler on, a range costs one check: its bytes
// (a number, or a function giving it) are computed only when one listens.
#pragma once

#include <ATen/record_function.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace torch_uvm {

class TraceScope {
 public:
  template <class Bytes = std::size_t>
  TraceScope(const char* what, const std::string& subject, Bytes&& bytes = 0,
             const c10::cuda::CUDAStream* stream = nullptr)
      : guard_(at::RecordScope::USER_SCOPE) {
    if (!guard_.isActive()) return;
    std::string name = std::string("torch_uvm::") + what;
    if (!subject.empty()) name += " " + subject;
    std::size_t n = 0;
    if constexpr (std::is_invocable_v<Bytes>) {
      n = bytes();
    } else {
      n = static_cast<std::size_t>(bytes);
    }
    std::unordered_map<std::string, c10::IValue> args{{"bytes", static_cast<int64_t>(n)}};
    if (stream != nullptr) {
      args.emplace("cuda_stream", static_cast<int64_t>(
                                      reinterpret_cast<std::uintptr_t>(stream->stream())));
    }
    const std::vector<c10::IValue> inputs;
    guard_.before(name, &inputs, &args);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  at::RecordFunction guard_;
};

}  // namespace torch_uvm
