#include "torch/state.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <pthread.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/config.h"
#include "core/errors.h"
#include "runtime/gpu_runtime.h"
#include "runtime/um_counters.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

std::atomic<CachingManagedAllocator*> g_allocator{nullptr};
std::atomic<bool> g_forked_child{false};
std::atomic<bool> g_hints{true};
std::string g_counters_not_armed = "the allocator has not started";   // set once, under g_create_mutex
std::atomic<int> g_captures{0};
std::atomic<PrefetchQueue*> g_queue{nullptr};
std::mutex g_create_mutex;

// fork(): no thread may hold the allocator's lock across it, or the child's
// first allocation waits forever. The forking thread takes the lock before
// the fork and releases it in both processes after.
void prepare_fork() {
  if (auto* a = g_allocator.load()) a->prepare_fork();
}
void after_fork_in_parent() {
  if (auto* a = g_allocator.load()) a->after_fork();
}
void after_fork_in_child() {
  g_forked_child = true;
  if (auto* a = g_allocator.load()) a->after_fork();
}

}  // namespace

CachingManagedAllocator* allocator_if_created() { return g_allocator.load(); }

bool in_forked_child() { return g_forked_child.load(std::memory_order_relaxed); }

bool managed_hints_supported() { return g_hints.load(); }

std::string driver_counters_not_armed() {
  std::lock_guard<std::mutex> lock(g_create_mutex);
  return g_counters_not_armed;
}

void note_capture_begin() { ++g_captures; }

void note_capture_end() { --g_captures; }

bool capture_underway() { return g_captures.load(std::memory_order_relaxed) > 0; }

ResidencyBudget& residency_budget() {
  // Leaked: copies may run during exit. PYTORCH_UVM_ALLOC_CONF's
  // residency_limit_mb is every GPU's budget from the start, so the copy
  // kernels see it before Python touches a GPU.
  static ResidencyBudget* budget = [] {
    auto* b = new ResidencyBudget();
    const std::size_t limit = config_from_environment().residency_limit;
    for (int d = 0; limit > 0 && d < c10::cuda::device_count(); ++d) b->set_limit(d, limit);
    return b;
  }();
  return *budget;
}

PrefetchQueue* prefetch_queue() {
  if (in_forked_child()) return nullptr;  // its worker thread stayed in the parent
  if (auto* q = g_queue.load()) return q;
  CachingManagedAllocator& a = allocator();
  const AllocatorConfig& config = a.policy().config();
  if (!config.async_prefetch || in_forked_child()) return nullptr;
  std::lock_guard<std::mutex> lock(g_create_mutex);
  if (auto* q = g_queue.load()) return q;
  // Leaked like the allocator; its worker is stopped at exit, before the
  // CUDA runtime (initialized earlier, so torn down later) goes away.
  auto* q = new PrefetchQueue(a.runtime(), {config.prefetch_chunk});
  // cudaFree synchronizes the device, including streams waiting on the
  // queue's worker: it issues everything, and takes nothing new, while
  // segments are freed (prefetches meanwhile run on the caller's thread).
  a.set_release_hooks([q] { q->pause(); }, [q] { q->resume(); });
  g_queue.store(q);
  std::atexit([] {
    if (auto* queue = g_queue.load(); queue != nullptr && !in_forked_child()) queue->stop();
  });
  return q;
}

void report_prefetch_errors() {
  if (auto* a = g_allocator.load()) {
    std::string hint = a->take_hint_error();
    if (!hint.empty()) {
      TORCH_WARN("torch_uvm: advice for a new segment failed (the memory is fine; its "
                 "pages migrate on fault instead): ", hint);
    }
  }
  if (auto* q = g_queue.load()) {
    if (auto error = q->take_error()) {
      TORCH_WARN("torch_uvm: an asynchronous prefetch failed (the data is intact; "
                 "kernels page-fault instead): ", *error);
    }
  }
}

CachingManagedAllocator& allocator() {
  if (auto* a = g_allocator.load()) return *a;
  std::lock_guard<std::mutex> lock(g_create_mutex);
  if (auto* a = g_allocator.load()) return *a;
  TORCH_CHECK(!in_forked_child(),
              "torch_uvm: managed memory cannot be used in a forked child "
              "process; CUDA does not survive fork(). Use the 'spawn' start "
              "method for processes that need the GPU.");
  return translate_errors([&]() -> CachingManagedAllocator& {
    auto runtime = std::make_shared<GpuRuntime>();
    int devices = runtime->device_count();
    TORCH_CHECK(devices > 0,
                "torch_uvm: no CUDA or ROCm device was found; managed memory "
                "needs a GPU and its driver. Check nvidia-smi / rocm-smi and "
                "CUDA_VISIBLE_DEVICES.");
    AllocatorConfig config = config_from_environment();
    bool hints = true;
    for (int d = 0; d < devices; ++d) hints = hints && runtime->concurrent_managed_access(d);
    if (!hints) {
      TORCH_WARN("torch_uvm: this system lacks concurrentManagedAccess; "
                 "prefetch and advice are disabled (pages migrate on fault).");
      config.advise_segments = false;
    }
    g_hints = hints;
    // Before the first managed allocation, so the driver counts them all;
    // never while torch.profiler records (CUPTI's buffers are its then).
    if (config.driver_counters && !torch::profiler::impl::profilerEnabled()) {
      g_counters_not_armed = UmCounters::arm();
    } else {
      g_counters_not_armed = config.driver_counters
                                 ? "torch.profiler was recording when the allocator started"
                                 : "PYTORCH_UVM_ALLOC_CONF has driver_counters:false";
    }
    // Leaked on purpose: tensors may outlive static destructors at exit.
    auto* a = new CachingManagedAllocator(std::move(runtime), config);
    pthread_atfork(&prepare_fork, &after_fork_in_parent, &after_fork_in_child);
    g_allocator.store(a);
    return *a;
  });
}

void rethrow_as_c10() {
  try {
    throw;
  } catch (const OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
  TORCH_CHECK(false, "torch_uvm: unknown error");
}

std::vector<std::pair<std::string, int64_t>> memory_stats() {
  auto* a = allocator_if_created();
  return a ? flatten(a->stats()) : flatten(MemoryStats{});
}

void empty_cache() {
  if (auto* a = allocator_if_created()) translate_errors([&] { a->empty_cache(); });
}

void reset_peak_memory_stats() {
  if (auto* a = allocator_if_created()) a->reset_peak_stats();
}

void reset_accumulated_memory_stats() {
  if (auto* a = allocator_if_created()) a->reset_accumulated_stats();
}

std::size_t memory_cap() { return allocator().cap(); }

void set_memory_cap(std::size_t bytes, bool allow_oversubscription) {
  auto& a = allocator();
  translate_errors([&] { a.set_cap(bytes, allow_oversubscription); });
}

}  // namespace torch_uvm
