// torch_uvm._C's offload half: pinned homes and slots, the residency budgets,
// an offloaded module's StreamExecutor, its units' lifecycle and gradient
// hooks, and how streamed bytes cross the link. Called by bindings.cpp's
// module definition; torch_uvm/offload*.py, residency.py and host_step.py
// use these.
#include "python/bindings_offload.h"

#include <pybind11/functional.h>
#include <torch/extension.h>

#include <mutex>

#include "core/residency.h"
#include "core/unit_lifecycle.h"
#include "torch/gradient_hooks.h"
#include "torch/managed_allocator.h"
#include "torch/managed_tensor.h"
#include "torch/pinned_home.h"
#include "torch/slot_memory.h"
#include "torch/state.h"
#include "torch/stream_executor.h"
#include "torch_uvm/torch_uvm.h"

namespace py = pybind11;

namespace torch_uvm {
namespace {

// A StreamExecutor's call as Python makes it: the GIL released, then the
// executor's lock held for the whole call (stream_executor.h, threading).
// Arguments are converted before (under the GIL), the result after, from a
// copy made under the lock. Without the GIL while waiting for the lock, no
// thread holds the GIL and waits for a thread that needs it.
template <typename R, typename... A, typename F>
auto locked_call(F f) {
  return [f](StreamExecutor& e, A... a) -> std::decay_t<R> {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(e.calls_lock());
    return (e.*f)(std::forward<A>(a)...);
  };
}
template <typename R, typename... A>
auto locked(R (StreamExecutor::*f)(A...)) { return locked_call<R, A...>(f); }
template <typename R, typename... A>
auto locked(R (StreamExecutor::*f)(A...) const) { return locked_call<R, A...>(f); }

}  // namespace

void bind_offload(py::module_& m) {
  // Whether t's memory is a streamed tensor's home (pinned_home.h).
  m.def("is_pinned_home", [](const at::Tensor& t) {
    return t.has_storage() && is_pinned_home(t.storage().data_ptr());
  });
  // A streamed tensor's home: t's value in pinned host memory, seen on `device`.
  // Pinning takes the kernel a while (about 1 GB/s): other Python threads
  // (offload's checkpoint readers) run meanwhile.
  m.def("pinned_home", [](const at::Tensor& t, const py::object& device) {
    const c10::Device d = with_index(device.cast<c10::Device>());
    py::gil_scoped_release nogil;
    return pinned_home_copy(t, d);
  });
  m.def("empty_pinned_home", [](const at::Tensor& like, const py::object& device) {
    const c10::Device d = with_index(device.cast<c10::Device>());
    py::gil_scoped_release nogil;
    return pinned_home_empty(like, d);
  });
  m.def("home_on_cpu", &home_on_cpu);
  m.def("fresh_home_on_cpu", &fresh_home_on_cpu);
  m.def("release_cached_slots", &release_cached_slots);
  m.def("slot_memory_stats", [](int device) {
    const SlotMemoryStats s = slot_memory_stats(static_cast<c10::DeviceIndex>(device));
    py::dict d;
    d["allocated_bytes"] = s.allocated;
    d["allocated_bytes.peak"] = s.allocated_peak;
    d["reserved_bytes"] = s.reserved;
    d["reserved_bytes.peak"] = s.reserved_peak;
    d["arena_bytes"] = s.arena_bytes;
    d["arena_misses"] = s.arena_misses;
    d["arena_waits"] = s.arena_waits;
    return d;
  });
  m.def("reset_slot_memory_peak",
        [](int device) { reset_slot_memory_peak(static_cast<c10::DeviceIndex>(device)); });
  m.def("alias_on_device", [](const at::Tensor& t, const py::object& device) {
    TORCH_CHECK(is_managed(t), "torch_uvm: only a managed tensor can be seen on another device");
    return alias_on_device(t, with_index(device.cast<c10::Device>()));  // "cuda": the current GPU
  });
  // The residency budgets (core/residency.h): one process-wide instance
  // (residency_budget below), which the copy kernels read too.
  // torch_uvm/residency.py carries out the evictions of batches; offloaded
  // modules stream through StreamExecutor.
  auto stats_dict = [](const ResidencyStats& s) {
    py::dict d;
    d["limit"] = s.limit;
    d["resident_bytes.current"] = s.resident_bytes;
    d["resident_bytes.peak"] = s.peak_resident_bytes;  // resident and leaving together
    d["leaving_bytes.current"] = s.leaving_bytes;
    d["prefetched_bytes"] = s.prefetched_bytes;
    d["evictions.drop"] = s.evictions[0];
    d["evictions.write_home"] = s.evictions[1];
    d["evictions.discard"] = s.discards;
    d["evicted_bytes.drop"] = s.evicted_bytes[0];
    d["evicted_bytes.write_home"] = s.evicted_bytes[1];
    d["evicted_bytes.discard"] = s.discarded_bytes;
    return d;
  };
  auto how = [](Eviction e) { return e == Eviction::kDrop ? "drop" : "write_home"; };
  py::class_<ResidencyBudget>(m, "ResidencyBudget")
      .def("set_limit", [](ResidencyBudget& b, int device, std::optional<std::size_t> bytes) {
        translate_errors([&] { b.set_limit(device, bytes); });
      })
      .def("limit", &ResidencyBudget::limit)
      .def("has_budget", &ResidencyBudget::has_budget)
      .def("open_share", [](ResidencyBudget& b, int device, std::size_t bytes,
                            const std::string& holder, std::size_t ceiling) {
        return translate_errors([&] { return b.open_share(device, bytes, holder, ceiling); });
      })
      .def("close_share", &ResidencyBudget::close_share)
      .def("shares", [](const ResidencyBudget& b, int device) {
        py::list out;
        for (const ShareInfo& s : b.shares(device)) {
          out.append(py::make_tuple(s.id, s.holder, s.budget, s.resident_bytes));
        }
        return out;
      })
      .def("admit", [how](ResidencyBudget& b, int device, std::uintptr_t address,
                          std::size_t bytes, bool written) {
        py::list out;
        translate_errors([&] {
          for (const EvictionStep& s : b.admit(device, address, bytes, written)) {
            out.append(py::make_tuple(s.address, s.bytes, how(s.how)));
          }
        });
        return out;
      })
      .def("evict", [how](ResidencyBudget& b, std::uintptr_t address) -> py::object {
        auto e = b.evict(address);
        return e ? py::object(py::str(how(*e))) : py::object(py::none());
      })
      .def("set_busy", &ResidencyBudget::set_busy)
      .def("mark_written", &ResidencyBudget::mark_written)
      .def("forget", &ResidencyBudget::forget)
      .def("discard", &ResidencyBudget::discard)
      .def("is_resident", &ResidencyBudget::is_resident)
      .def("is_busy", &ResidencyBudget::is_busy)
      .def("reset_peak", &ResidencyBudget::reset_peak)
      .def("label", &ResidencyBudget::label)
      .def("unlabel", &ResidencyBudget::unlabel)
      .def("start_timeline", &ResidencyBudget::start_timeline)
      .def("take_timeline", [](ResidencyBudget& b) {
        std::size_t dropped = 0;
        py::list out;
        for (const ResidencyEvent& e : b.take_timeline(&dropped)) {
          py::dict d;
          d["time_ns"] = e.time_ns;
          d["device"] = static_cast<int>(e.device);
          d["share"] = e.share;
          d["address"] = e.address;
          d["bytes"] = e.bytes;
          d["kind"] = kind_name(e.kind);
          d["share_resident"] = e.share_resident;
          d["device_resident"] = e.device_resident;
          d["label"] = e.label;
          out.append(d);
        }
        return py::make_tuple(out, dropped);
      })
      .def("stats", [stats_dict](const ResidencyBudget& b, int device) {
        return stats_dict(b.stats(device));
      })
      .def("share_stats", [stats_dict](const ResidencyBudget& b, ShareId share) {
        return stats_dict(b.share_stats(share));
      });
  m.def("residency_budget",
        []() -> ResidencyBudget& {
          return translate_errors([]() -> ResidencyBudget& { return residency_budget(); });
        },
        py::return_value_policy::reference);
  // One offloaded module's streaming (torch/stream_executor.h), driven by
  // torch_uvm/offload.py's hooks.
  py::class_<StreamExecutor>(m, "StreamExecutor")
      .def(py::init([](ShareId share, const py::object& device, int ahead, bool in_place,
                       bool training) {
             return translate_errors([&] {
               return std::make_unique<StreamExecutor>(residency_budget(), share,
                                                       with_index(device.cast<c10::Device>()),
                                                       ahead, in_place, training);
             });
           }),
           py::arg("share"), py::arg("device"), py::arg("ahead"), py::arg("in_place"),
           py::arg("training"))
      .def("add_unit", locked(&StreamExecutor::add_unit), py::arg("name"), py::arg("targets"),
           py::arg("trainable"), py::arg("buffers") = std::vector<at::Tensor>{})
      .def("plan", locked(&StreamExecutor::plan))
      .def("streamed_per_pass", locked(&StreamExecutor::streamed_per_pass))
      .def("set_in_place", locked(&StreamExecutor::set_in_place))
      .def("planned", locked(&StreamExecutor::planned))
      .def("order", locked(&StreamExecutor::order))
      .def("resident", locked(&StreamExecutor::resident))
      .def("before", locked(&StreamExecutor::before))
      .def("after", locked(&StreamExecutor::after))
      .def("grads_ready", locked(&StreamExecutor::grads_ready), py::arg("unit"),
           py::arg("send_home"), py::arg("wait_home") = true)
      .def("discard_grads", locked(&StreamExecutor::discard_grads))
      .def("step_begins", locked(&StreamExecutor::step_begins))
      .def("bring", locked(&StreamExecutor::bring), py::arg("tensors"), py::arg("new_bytes") = 0)
      .def("step_done", locked(&StreamExecutor::step_done))
      .def("end_pass", locked(&StreamExecutor::end_pass))
      .def("evict_unused", locked(&StreamExecutor::evict_unused))
      .def("evict_all", locked(&StreamExecutor::evict_all))
      .def("evict_unit", locked(&StreamExecutor::evict_unit))
      .def("set_home_busy", locked(&StreamExecutor::set_home_busy))
      // the cudaStream_t, for torch.cuda.ExternalStream
      .def("home_stream",
           [](const StreamExecutor& e) {
             return reinterpret_cast<std::intptr_t>(e.home_stream().stream());
           })
      .def("limit_copies_home", locked(&StreamExecutor::limit_copies_home))
      .def("step_queued", locked(&StreamExecutor::step_queued), py::arg("steps_behind"))
      .def("waits_for_steps", locked(&StreamExecutor::waits_for_steps))
      .def("copies_home_under_way", locked(&StreamExecutor::copies_home_under_way))
      .def("set_training", locked(&StreamExecutor::set_training))
      .def("set_trainable", locked(&StreamExecutor::set_trainable))
      .def("largest_trainable", locked(&StreamExecutor::largest_trainable))
      .def("holders", locked(&StreamExecutor::holders))
      .def("staged", locked(&StreamExecutor::staged))
      .def("streamed_tensors", locked(&StreamExecutor::streamed_tensors))
      .def("bytes_on_gpu", locked(&StreamExecutor::bytes_on_gpu));
  m.attr("SMALLEST_STREAMED_STATE") = StreamExecutor::kSmallestStreamed;
  // What decides when an offload's units step (core/unit_lifecycle.h),
  // driven by torch_uvm/offload_training.py's hooks. Its OrderError is a
  // RuntimeError here.
  py::class_<UnitLifecycle, std::shared_ptr<UnitLifecycle>>(m, "UnitLifecycle")
      .def(py::init<std::vector<std::string>>(), py::arg("names"))
      .def("set_expected", &UnitLifecycle::set_expected)
      .def("expected", &UnitLifecycle::expected)
      .def("backward_begins",
           [](UnitLifecycle& l, int unit, bool step_in_backward) {
             auto b = l.backward_begins(unit, step_in_backward);
             return py::make_tuple(b.opened, b.released);
           })
      .def("gradient", &UnitLifecycle::gradient)
      .def("steps_in_backward", &UnitLifecycle::steps_in_backward)
      .def("stepped", &UnitLifecycle::stepped, py::arg("unit"), py::arg("in_backward"))
      .def("has_stepped", &UnitLifecycle::has_stepped)
      .def("stepped_units", &UnitLifecycle::stepped_units)
      .def("stepped_in_backward", &UnitLifecycle::stepped_in_backward)
      .def("set_host_units", &UnitLifecycle::set_host_units)
      .def("on_host", &UnitLifecycle::on_host)
      .def("backward_active", &UnitLifecycle::backward_active)
      .def("end_backward", &UnitLifecycle::end_backward)
      .def("step_ends", &UnitLifecycle::step_ends)
      .def("state", [](const UnitLifecycle& l, int unit) { return to_string(l.state(unit)); })
      .def("check", &UnitLifecycle::check);
  // Its units' gradients counted in C++ (torch/gradient_hooks.h): `complete`
  // is called with a unit's index once its last gradient of a backward came
  // (holding the GIL; an exception it raises fails the backward).
  py::class_<GradientHooks>(m, "GradientHooks")
      .def(py::init<std::shared_ptr<UnitLifecycle>, GradientHooks::Complete>(),
           py::arg("lifecycle"), py::arg("complete"))
      .def("add", &GradientHooks::add, py::arg("unit"), py::arg("param"))
      .def("hooked", &GradientHooks::hooked)
      .def("__len__", &GradientHooks::size)
      .def("remove", &GradientHooks::remove);
  // How streamed bytes cross the link (streamed_tensor.h): "copy_engine" or
  // "kernel", to the GPU and home. For benchmarks comparing them.
  m.def("set_copy_mechanisms", [](const std::string& to_gpu, const std::string& home) {
    auto parse = [](const std::string& v) {
      TORCH_CHECK_VALUE(v == "copy_engine" || v == "kernel", "torch_uvm: a copy mechanism is ",
                        "'copy_engine' or 'kernel', got '", v, "'");
      return v == "kernel" ? CopyBy::kKernel : CopyBy::kCopyEngine;
    };
    set_copy_mechanisms({parse(to_gpu), parse(home)});
  });
  m.def("copy_mechanisms", [] {
    auto name = [](CopyBy b) { return b == CopyBy::kKernel ? "kernel" : "copy_engine"; };
    CopyMechanisms c = copy_mechanisms();
    return py::make_tuple(name(c.to_gpu), name(c.home));
  });
}

}  // namespace torch_uvm
