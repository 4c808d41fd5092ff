#include "runtime/host_runtime.h"

#include <cstdlib>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/errors.h"

namespace torch_uvm {

HostRuntime::HostRuntime(int devices, std::size_t memory_per_device)
    : devices_(devices), memory_per_device_(memory_per_device) {}

namespace {

// Whether an injected failure is due (counted down).
bool injected(std::atomic<int>& due) {
  if (due <= 0) return false;
  --due;
  return true;
}

}  // namespace

HostRuntime::~HostRuntime() {
  for (auto& [ptr, size] : live_) std::free(ptr);
  for (auto& [ptr, size] : host_live_) std::free(ptr);
  for (Event* e : events_) delete e;
}

void* HostRuntime::allocate_managed(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.allocations;
  if (injected(fail_next_)) return nullptr;
  if (bytes > memory_per_device_ || in_use_ > memory_per_device_ - bytes) {
    return nullptr;
  }
  // 2 MiB alignment, like cudaMallocManaged's large pages; rounded so that
  // aligned_alloc's size rule holds.
  constexpr std::size_t kAlign = 2u << 20;
  std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) return nullptr;
  live_[p] = bytes;
  in_use_ += bytes;
  return p;
}

// Host memory is host memory: plain malloc, counted apart from the fake GPUs'.
void* HostRuntime::allocate_host(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.host_allocations;
  if (injected(fail_next_host_)) return nullptr;
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p != nullptr) host_live_[p] = bytes;
  return p;
}

void HostRuntime::free_host(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = host_live_.find(ptr);
  if (it == host_live_.end()) throw RuntimeError("HostRuntime::free_host: unknown pointer");
  host_live_.erase(it);
  std::free(ptr);
}

void HostRuntime::free_managed(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.frees;
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    throw RuntimeError("HostRuntime::free_managed: unknown pointer");
  }
  in_use_ -= it->second;
  live_.erase(it);
  std::free(ptr);
}

void HostRuntime::advise(const void* ptr, std::size_t, Advice advice,
                         DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.advises;
  advice_[ptr].emplace_back(advice, device);
}

void HostRuntime::prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                           StreamRef stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  prefetch_released_.wait(lock, [this] { return !hold_prefetches_; });
  ++counters_.prefetches;
  if (fail_prefetch_ > 0) {
    --fail_prefetch_;
    throw RuntimeError("HostRuntime::prefetch: injected failure");
  }
  prefetch_log_.push_back({ptr, bytes, target, stream});
}

void HostRuntime::hold_prefetches(bool hold) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    hold_prefetches_ = hold;
  }
  prefetch_released_.notify_all();
}

StreamRef HostRuntime::create_stream(DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return {device, next_stream_++};
}

FlagHandle HostRuntime::create_flag() {
  if (!flags_supported_) return nullptr;
  return new std::uint32_t(0);
}

void HostRuntime::destroy_flag(FlagHandle flag) { delete flag; }

bool HostRuntime::satisfied(const std::vector<FlagWait>& waits) {
  for (const auto& [flag, value] : waits) {
    // Compared cyclically, as the runtime interface defines it.
    if (static_cast<std::int32_t>(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - value) < 0) return false;
  }
  return true;
}

void HostRuntime::wait_for_flags(std::vector<FlagWait> waits) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!satisfied(waits)) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw RuntimeError("HostRuntime: a stream waits on a flag that is never written "
                         "(on a GPU this would hang the stream)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void HostRuntime::stream_wait_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.flag_waits;
  auto& waits = flag_waits_[stream];
  std::vector<FlagWait> pending;
  for (const auto& w : waits) {
    if (!satisfied({w})) pending.push_back(w);
  }
  pending.emplace_back(flag, value);
  waits.swap(pending);
}

void HostRuntime::synchronize_stream(StreamRef stream) {
  std::vector<FlagWait> waits;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = flag_waits_.find(stream);
    if (it != flag_waits_.end()) waits = it->second;
  }
  wait_for_flags(waits);
}

void HostRuntime::stream_write_flag(StreamRef, FlagHandle flag, std::uint32_t value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.flag_writes;
  }
  __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}

std::vector<HostRuntime::PrefetchCall> HostRuntime::prefetch_log() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return prefetch_log_;
}

EventHandle HostRuntime::create_event(DeviceIndex) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.events_created;
  auto* e = new Event();
  events_.insert(e);
  return e;
}

void HostRuntime::destroy_event(EventHandle event) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.events_destroyed;
  auto* e = static_cast<Event*>(event);
  events_.erase(e);
  delete e;
}

void HostRuntime::record_event(EventHandle event, StreamRef stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.event_records;
  auto* e = static_cast<Event*>(event);
  e->complete = auto_complete_;
  e->stream = stream;
  auto it = flag_waits_.find(stream);
  e->waits = it == flag_waits_.end() ? std::vector<FlagWait>{} : it->second;
}

bool HostRuntime::query_event(EventHandle event) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.event_queries;
  auto* e = static_cast<Event*>(event);
  return e->complete && satisfied(e->waits);
}

void HostRuntime::synchronize_event(EventHandle event) {
  std::vector<FlagWait> waits;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.event_syncs;
    auto* e = static_cast<Event*>(event);
    e->complete = true;  // "waiting" finishes the work...
    waits = e->waits;
  }
  wait_for_flags(waits);  // ...once the flags it waits behind are written
}

void HostRuntime::stream_wait_event(StreamRef, EventHandle) {}

void HostRuntime::copy(void* dst, const void* src, std::size_t bytes, StreamRef, bool,
                       CopyKind) {
  std::memmove(dst, src, bytes);
}

DeviceMemoryInfo HostRuntime::memory_info(DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.memory_info_reads[device];
  return {memory_per_device_ - in_use_, memory_per_device_};
}

void HostRuntime::set_auto_complete_events(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto_complete_ = on;
}

void HostRuntime::complete_events(const StreamRef* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Event* e : events_) {
    if (stream == nullptr || e->stream == *stream) e->complete = true;
  }
}

HostRuntime::Counters HostRuntime::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

std::size_t HostRuntime::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

std::vector<std::pair<Advice, DeviceIndex>> HostRuntime::advice_for(
    const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = advice_.find(ptr);
  return it == advice_.end() ? std::vector<std::pair<Advice, DeviceIndex>>{}
                             : it->second;
}

}  // namespace torch_uvm
