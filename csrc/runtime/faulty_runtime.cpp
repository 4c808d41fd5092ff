#include "runtime/faulty_runtime.h"

#include <string>

#include "core/errors.h"

namespace torch_uvm {
namespace {

const char* call_name(FaultyRuntime::Call c) {
  static const char* names[] = {"allocate", "free", "advise", "prefetch", "event create",
                                "event record", "event query", "event sync", "stream wait",
                                "flag write", "stream sync"};
  return names[c];
}

}  // namespace

void FaultyRuntime::fail_randomly(double p, unsigned mask, std::uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex_);
  probability_ = p;
  rng_.seed(seed);
  random_mask_ = mask;
}

void FaultyRuntime::stop_failing() {
  random_mask_ = 0;
  for (auto& n : next_) n = 0;
}

void FaultyRuntime::before(Call call, std::function<void()> hook) { hooks_[call] = std::move(hook); }

bool FaultyRuntime::should_fail(Call call) {
  int n = next_[call].load();
  while (n > 0) {
    if (next_[call].compare_exchange_weak(n, n - 1)) return true;
  }
  if ((random_mask_.load() >> call) & 1u) {
    std::lock_guard<std::mutex> lock(rng_mutex_);
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < probability_;
  }
  return false;
}

void FaultyRuntime::enter(Call call) {
  if (should_fail(call)) {
    ++injected_;
    throw RuntimeError(std::string("torch_uvm: injected failure of ") + call_name(call));
  }
  if (hooks_[call]) hooks_[call]();
}

void* FaultyRuntime::allocate_managed(std::size_t bytes) {
  if (should_fail(kAllocate)) {
    // Alternate the two ways a driver refuses: out of memory, and an error.
    if (++injected_ % 2 == 0) return nullptr;
    throw RuntimeError("torch_uvm: injected failure of allocate");
  }
  if (hooks_[kAllocate]) hooks_[kAllocate]();
  return inner_->allocate_managed(bytes);
}

void* FaultyRuntime::allocate_host(std::size_t bytes) {
  enter(kAllocate);
  return inner_->allocate_host(bytes);
}

void FaultyRuntime::free_host(void* ptr) {
  enter(kFree);
  inner_->free_host(ptr);
}

void FaultyRuntime::free_managed(void* ptr) {
  enter(kFree);
  inner_->free_managed(ptr);
}

void FaultyRuntime::advise(const void* ptr, std::size_t bytes, Advice advice, DeviceIndex device) {
  enter(kAdvise);
  inner_->advise(ptr, bytes, advice, device);
}

void FaultyRuntime::prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                             StreamRef stream) {
  enter(kPrefetch);
  inner_->prefetch(ptr, bytes, target, stream);
}

EventHandle FaultyRuntime::create_event(DeviceIndex device) {
  enter(kEventCreate);
  return inner_->create_event(device);
}

void FaultyRuntime::record_event(EventHandle event, StreamRef stream) {
  enter(kEventRecord);
  inner_->record_event(event, stream);
}

bool FaultyRuntime::query_event(EventHandle event) {
  enter(kEventQuery);
  return inner_->query_event(event);
}

void FaultyRuntime::synchronize_event(EventHandle event) {
  enter(kEventSync);
  inner_->synchronize_event(event);
}

void FaultyRuntime::stream_wait_event(StreamRef stream, EventHandle event) {
  enter(kStreamWait);
  inner_->stream_wait_event(stream, event);
}

void FaultyRuntime::synchronize_stream(StreamRef stream) {
  enter(kStreamSync);
  inner_->synchronize_stream(stream);
}

void FaultyRuntime::stream_wait_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) {
  enter(kStreamWait);
  inner_->stream_wait_flag(stream, flag, value);
}

void FaultyRuntime::stream_write_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) {
  enter(kFlagWrite);
  inner_->stream_write_flag(stream, flag, value);
}

}  // namespace torch_uvm
