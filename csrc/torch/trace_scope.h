// torch_uvm's own work in profiler traces: a range named "torch_uvm::<what>
// <subject>" (a submodule's or a tensor's name), with its bytes and the
// stream its copies run on as arguments. It shows in torch.profiler traces
// (export_chrome_trace, TensorBoard), where the copies it queues are linked
// to it, and, under torch.autograd.profiler.emit_nvtx, as an NVTX range in
// Nsight Systems. With no profiler on, a range costs one check: its subject
// and bytes are computed only when one listens.
#pragma once

#include <ATen/record_function.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/types.h"

namespace torch_uvm {

class TraceScope {
 public:
  // `stream`: the stream its copies run on (none: the caller's thread only).
  // `subject` and `bytes` are values, or functions giving them, called only
  // when a profiler listens.
  template <class Subject, class Bytes = std::size_t>
  TraceScope(const char* what, Subject&& subject, Bytes&& bytes = 0,
             std::optional<StreamRef> stream = std::nullopt)
      : guard_(at::RecordScope::USER_SCOPE) {
    if (!guard_.isActive()) return;
    begin(what, value<std::string>(subject), value<std::size_t>(bytes), stream);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  template <class T, class V>
  static T value(V& v) {
    if constexpr (std::is_invocable_v<V&>) {
      return static_cast<T>(v());
    } else {
      return static_cast<T>(v);
    }
  }
  void begin(const char* what, const std::string& subject, std::size_t bytes,
             std::optional<StreamRef> stream) {
    std::string name = std::string("torch_uvm::") + what;
    if (!subject.empty()) name += " " + subject;
    std::unordered_map<std::string, c10::IValue> args{{"bytes", static_cast<int64_t>(bytes)}};
    // (the default stream's handle is 0: still a stream)
    if (stream.has_value()) args.emplace("cuda_stream", static_cast<int64_t>(stream->handle));
    const std::vector<c10::IValue> inputs;
    guard_.before(name, &inputs, &args);
  }

  at::RecordFunction guard_;
};

}  // namespace torch_uvm
