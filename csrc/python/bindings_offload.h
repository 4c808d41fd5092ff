// torch_uvm._C's offload half (bindings_offload.cpp), added to the module by
// bindings.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace torch_uvm {

void bind_offload(pybind11::module_& m);

}  // namespace torch_uvm
