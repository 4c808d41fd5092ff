// Process-wide state of the torch glue: the one allocator, the switches, and
// what fork did. Kept apart so that every other glue file reads it the same way.
#pragma once

#include <c10/util/Exception.h>

#include <atomic>

#include "core/caching_managed_allocator.h"
#include "core/prefetch_queue.h"
#include "core/residency.h"

namespace torch_uvm {

// The allocator if it was created, else nullptr. Never blocks or creates.
CachingManagedAllocator* allocator_if_created();

// True in a child made by fork() after the allocator existed: CUDA is not
// usable there, so the glue falls back to ordinary memory and leaks (never
// frees) managed pointers inherited from the parent.
bool in_forked_child();

// Whether prefetch and advice work on this machine (concurrentManagedAccess).
bool managed_hints_supported();

// Why the driver's unified-memory counters were not enabled when the
// allocator started (runtime/um_counters.h: memory allocated before they
// were is not counted), or "" if they were.
std::string driver_counters_not_armed();

// CUDA graph captures (pools being allocated to) under way, as PyTorch
// announces them to the CUDA allocator (cuda_graph_pools.cpp). While one is,
// torch_uvm makes no driver call that would break it: CPU tensors come from
// the ordinary CPU allocator and moves skip their prefetch.
void note_capture_begin();
void note_capture_end();
bool capture_underway();

// The worker that issues prefetches off the caller's thread
// (core/prefetch_queue.h), or nullptr when PYTORCH_UVM_ALLOC_CONF turned
// async_prefetch off. Created with the allocator's runtime on first use and
// stopped at exit.
PrefetchQueue* prefetch_queue();

// The residency budgets that torch_uvm/residency.py drives (offload,
// prefetching, bring). The copy kernels read it too: a copy into memory
// streamed under a budget is left to PyTorch.
ResidencyBudget& residency_budget();

// Reports, as a warning, a failure of an earlier asynchronous prefetch.
void report_prefetch_errors();

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
