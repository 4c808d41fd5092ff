// Process-wide state of the torch glue: the one allocator, the switches, and
// what fork did. Kept apart so that every other glue file reads it the same way.
#pragma once

#include <c10/util/Exception.h>

#include <atomic>

#include "core/caching_managed_allocator.h"

namespace torch_uvm {

// The allocator if it was created, else nullptr. Never blocks or creates.
CachingManagedAllocator* allocator_if_created();

// True in a child made by fork() after the allocator existed: CUDA is not
// usable there, so the glue falls back to ordinary memory and leaks (never
// frees) managed pointers inherited from the parent.
bool in_forked_child();

// Whether prefetch and advice work on this machine (concurrentManagedAccess).
bool managed_hints_supported();

// Translates the core's exceptions into c10 errors (ValueError, OutOfMemory,
// RuntimeError) so Python sees the right exception type.
[[noreturn]] void rethrow_as_c10();

template <typename F>
auto translate_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (...) {
    rethrow_as_c10();
  }
}

}  // namespace torch_uvm
