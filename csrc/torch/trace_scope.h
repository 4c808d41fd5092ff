// torch_uvm's own work in profiler traces: a range named "torch_uvm::<what>
// <subject>" (a submodule's or a tensor's name), with its bytes and the
// stream its copies run on as arguments. It shows in torch.profiler traces
// (export_chrome_trace, TensorBoard), where the copies it queues are linked
// to it, and, under torch.autograd.profiler.emit_nvtx, as an NVTX range in
// Nsight Systems. With no profiler on, a range costs one check.
#pragma once

#include <ATen/record_function.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_uvm {

class TraceScope {
 public:
  TraceScope(const char* what, const std::string& subject, std::size_t bytes = 0,
             std::uintptr_t stream = 0)
      : guard_(at::RecordScope::USER_SCOPE) {
    if (!guard_.isActive()) return;
    std::string name = std::string("torch_uvm::") + what;
    if (!subject.empty()) name += " " + subject;
    std::unordered_map<std::string, c10::IValue> args{
        {"bytes", static_cast<int64_t>(bytes)}};
    if (stream != 0) args.emplace("cuda_stream", static_cast<int64_t>(stream));
    const std::vector<c10::IValue> inputs;
    guard_.before(name, &inputs, &args);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  at::RecordFunction guard_;
};

}  // namespace torch_uvm
