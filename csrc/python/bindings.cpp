// The Python module torch_uvm._C: a thin layer over include/torch_uvm/torch_uvm.h.
// torch_uvm/__init__.py documents and types these for users. This file: the
// allocator, moves and memory statistics; the offload's half (homes, slots,
// budgets, the executor, the lifecycle) is bindings_offload.cpp's.
#include <torch/extension.h>

#include "core/config.h"
#include "python/bindings_offload.h"
#include "python/driver_counters.h"
#include "torch/managed_allocator.h"
#include "torch/managed_tensor.h"
#include "torch/forked_worker_memory.h"
#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace py = pybind11;
using namespace torch_uvm;

namespace {

py::dict segment_to_dict(const SegmentSnapshot& s) {
  py::dict d;
  d["address"] = s.address;
  d["total_size"] = s.total_size;
  d["allocated_size"] = s.allocated_size;
  d["active_size"] = s.active_size;
  d["requested_size"] = s.requested_size;
  d["device"] = s.home == kCpuDevice ? py::object(py::str("cpu")) : py::object(py::int_(s.home));
  d["stream"] = s.stream.handle;
  d["segment_type"] = s.segment_type;
  d["segment_pool_id"] = py::make_tuple(s.pool.first, s.pool.second);
  py::list blocks;
  for (const auto& b : s.blocks) {
    py::dict bd;
    bd["address"] = b.address;
    bd["size"] = b.size;
    bd["requested_size"] = b.requested_size;
    bd["state"] = b.state;
    blocks.append(bd);
  }
  d["blocks"] = blocks;
  return d;
}

std::optional<c10::Stream> to_stream(const py::object& stream) {
  if (stream.is_none()) return std::nullopt;
  // torch.cuda.Stream / torch.Stream expose stream_id, device_index, device_type.
  return c10::Stream::unpack3(stream.attr("stream_id").cast<int64_t>(),
                              stream.attr("device_index").cast<c10::DeviceIndex>(),
                              static_cast<c10::DeviceType>(stream.attr("device_type").cast<int64_t>()));
}


}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_uvm native module (use the torch_uvm package instead)";
  m.def("enable", &enable);
  m.def("disable", &disable);
  m.def("is_enabled", &is_enabled);
  m.def("enable_from_environment", &enable_from_environment);
  m.def("set_move_on_copy", &set_move_on_copy);
  m.def("move_on_copy", &move_on_copy);
  m.def("set_move_advice", &set_move_advice);
  m.def("move_advice", &move_advice);
  m.def("set_fast_copy", &set_fast_copy);
  m.def("fast_copy", &fast_copy);
  m.def("is_managed", &is_managed);
  // Where a managed tensor's allocation is homed: -1 for the CPU, a GPU's
  // index, or None when it is not managed.
  m.def("managed_home", [](const at::Tensor& t) -> py::object {
    auto where = managed_allocation(t);
    if (!where) return py::none();
    return py::int_(where->home == kCpuDevice ? -1 : static_cast<int>(where->home));
  });
  // the bytes a tensor's elements span (tensor_span): what a prefetch moves
  m.def("span_bytes", [](const at::Tensor& t) { return tensor_span(t).second; });
  m.def("manage_memory", &manage_memory);
  m.def("unmanage_memory", &unmanage_memory);
  m.def("adopt_copy_in_forked_child", &adopt_copy_in_forked_child);
  bind_offload(m);
  m.def("uvm_to", &uvm_to, py::arg("tensor"), py::arg("device"), py::arg("non_blocking") = false);
  m.def("prefetch",
        [](const at::Tensor& t, std::optional<at::Device> device, const py::object& stream) {
          prefetch(t, device, to_stream(stream));
        },
        py::arg("tensor"), py::arg("device") = py::none(), py::arg("stream") = py::none());
  m.def("advise", &advise, py::arg("tensor"), py::arg("advice"), py::arg("device") = py::none());
  m.def("memory_stats", [] {
    py::dict d;
    for (const auto& [k, v] : memory_stats()) d[py::str(k)] = v;
    return d;
  });
  m.def("memory_snapshot", [] {
    py::list out;
    if (auto* a = allocator_if_created()) {
      for (const auto& s : a->snapshot()) out.append(segment_to_dict(s));
    }
    return out;
  });
  m.def("empty_cache", &empty_cache);
  m.def("reset_peak_memory_stats", &reset_peak_memory_stats);
  m.def("reset_accumulated_memory_stats", &reset_accumulated_memory_stats);
  m.def("memory_cap", &memory_cap);
  m.def("safe_cap_limit", [] { return allocator().safe_cap_limit(); });
  m.def("set_memory_cap", &set_memory_cap, py::arg("bytes"),
        py::arg("allow_oversubscription") = false);
  m.def("set_release_threshold", [](std::size_t bytes) { allocator().set_release_threshold(bytes); });
  m.def("allocator_created", [] { return allocator_if_created() != nullptr; });
  m.def("parse_alloc_conf", [](const std::string& text) {
    translate_errors([&] { parse_config(text); });
  });
  m.def("parse_bool", [](const std::string& value, const std::string& what) {
    return translate_errors([&] { return parse_bool(value, what); });
  });
  m.def("describe_options", &describe_options);
  // The offload's environment variables (core/config.h), as set now.
  m.def("offload_environment", [] {
    const OffloadEnvironment e = offload_environment();
    py::dict d;
    d["host_step_threads"] = e.host_step_threads;
    d["host_step_copies"] = e.host_step_copies;
    d["quiet"] = e.quiet;
    return d;
  });
  m.def("describe_offload_variables", &describe_offload_variables);
  bind_driver_counters(m);
  m.def("check_invariants", [] {
    if (auto* a = allocator_if_created()) translate_errors([&] { a->check_invariants(); });
  });
}
