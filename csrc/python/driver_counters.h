// torch_uvm._C's side of the driver's counters (runtime/um_counters.h): start,
// stop, and each event named by core/address_names.h from the names Python
// gives (tensors, submodules) and then the allocator's own allocations.
#pragma once

#include <torch/extension.h>

namespace torch_uvm {
void bind_driver_counters(pybind11::module_& m);
}
