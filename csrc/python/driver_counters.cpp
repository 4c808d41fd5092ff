#include "python/driver_counters.h"

#include <cstdio>

#include "core/address_names.h"
#include "core/errors.h"
#include "runtime/um_counters.h"
#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace py = pybind11;

namespace torch_uvm {
namespace {

// After the names Python gave: each of the allocator's blocks, "allocation
// 0x... (N MiB)" while it is handed out and "cached 0x..." while it is not.
void name_allocations(AddressNames& names) {
  CachingManagedAllocator* a = allocator_if_created();
  if (a == nullptr) return;
  for (const SegmentSnapshot& s : a->snapshot()) {
    for (const BlockSnapshot& b : s.blocks) {
      char size[32];
      std::snprintf(size, sizeof size, "%.1f MiB", b.size / 1048576.0);
      const bool used = b.state != "inactive";
      names.add(b.address, b.size,
                std::string(used ? "allocation " : "cached ") +
                    hex(reinterpret_cast<const void*>(b.address)) + " (" + size + ")");
    }
  }
}

py::dict to_dict(const UmEvent& e, const AddressNames& names) {
  py::dict d;
  d["kind"] = kind_name(e.kind);
  d["cause"] = cause_name(e.cause);
  d["address"] = e.address;
  d["value"] = e.value;
  d["start_ns"] = e.start_ns;
  d["end_ns"] = e.end_ns;
  d["device"] = static_cast<int>(e.device);
  py::list pieces;   // (name, bytes) for byte counts; (name, count) for the rest
  if (e.counts_bytes()) {
    names.split(e.address, e.value, [&](const std::string& name, std::size_t bytes) {
      pieces.append(py::make_tuple(name, bytes));
    });
  } else {
    pieces.append(py::make_tuple(names.name_at(e.address), e.value));
  }
  d["pieces"] = pieces;
  return d;
}

}  // namespace

void bind_driver_counters(py::module_& m) {
  m.def("um_counters_start", [] { return translate_errors([] { return UmCounters::start(); }); });
  m.def("driver_counters_not_armed", &driver_counters_not_armed);
  // names: [(address, bytes, name)], the first name of a byte keeps it.
  m.def("um_counters_stop", [](const std::vector<std::tuple<std::uintptr_t, std::size_t,
                                                            std::string>>& given) {
    UmRecording r = translate_errors([] { return UmCounters::stop(); });
    AddressNames names;
    for (const auto& [address, bytes, name] : given) names.add(address, bytes, name);
    name_allocations(names);
    py::list events;
    for (const UmEvent& e : r.events) events.append(to_dict(e, names));
    return py::make_tuple(events, r.dropped, r.missing, r.other);
  });
}

}  // namespace torch_uvm
