// Turning UVM on: both allocator slots, once, in the order that can fail
// first (CUDA) before the one that cannot (CPU), so a refusal changes nothing.
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/config.h"
#include "core/errors.h"
#include "torch/managed_allocator.h"
#include "torch/slots.h"
#include "torch/state.h"
#include "torch_uvm/torch_uvm.h"

namespace torch_uvm {
namespace {

std::atomic<bool> g_enabled{false};
std::mutex g_enable_mutex;

}  // namespace

void install_cpu_slot() {
  // Priority above the default allocator's, so later default registrations
  // do not displace us.
  c10::SetCPUAllocator(ManagedAllocator::for_device(c10::Device(c10::kCPU)), /*priority=*/100);
}

void enable() {
  std::lock_guard<std::mutex> lock(g_enable_mutex);
  if (g_enabled) return;
  TORCH_CHECK(!in_forked_child(), "torch_uvm: cannot enable UVM in a forked child process");
  allocator();  // fails clearly without a GPU, before anything is changed
  install_cuda_slot();
  install_cpu_slot();
  g_enabled = true;
}

void disable() {
  TORCH_CHECK(!g_enabled,
              "torch_uvm: UVM cannot be turned off once it is on: tensors already "
              "allocated from managed memory stay managed, and PyTorch cannot swap "
              "its CUDA allocator back (RFC-0023 keeps UVM on once on). Start a "
              "new process without PYTORCH_ENABLE_UNIFIED_MEMORY instead.");
}

bool is_enabled() { return g_enabled.load(); }

void enable_from_environment() {
  const char* value = std::getenv("PYTORCH_ENABLE_UNIFIED_MEMORY");
  if (value == nullptr || *value == '\0') return;
  bool on = translate_errors([&] {
    return parse_bool(value, "PYTORCH_ENABLE_UNIFIED_MEMORY");
  });
  if (on) enable();
}

}  // namespace torch_uvm
