// PYTORCH_ENABLE_UNIFIED_MEMORY for C++ programs: libtorch_uvm turns UVM on
// when it is loaded, before main() can create a tensor. (The Python module
// does this at import instead, where a bad value raises.)
//
// A static initializer must not throw: a bad value, or no GPU, is reported on
// stderr and UVM stays off; torch_uvm::enable_from_environment() raises the
// same error as a c10::Error for programs that want to stop.
//
// This file is linked last into libtorch_uvm, so the library's other
// initializers (the dispatcher registrations) have run.
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "torch_uvm/torch_uvm.h"

namespace {

struct EnableOnLoad {
  EnableOnLoad() {
    const char* value = std::getenv("PYTORCH_ENABLE_UNIFIED_MEMORY");
    if (value == nullptr || *value == '\0') return;
    try {
      torch_uvm::enable_from_environment();
    } catch (const c10::Error& e) {
      report(value, e.what_without_backtrace());
    } catch (const std::exception& e) {
      report(value, e.what());
    }
  }
  static void report(const char* value, const char* why) {
    std::fprintf(stderr,
                 "torch_uvm: PYTORCH_ENABLE_UNIFIED_MEMORY=%s is set, but UVM stays off: %s\n",
                 value, why);
  }
};

const EnableOnLoad enable_on_load;

}  // namespace
