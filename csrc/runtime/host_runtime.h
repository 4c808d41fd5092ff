// HostRuntime: the Runtime over plain host memory, so that the caching policy
// is tested without a GPU. It counts every call (a cache hit must make none),
// can be told how much "device" memory exists, can fail allocations on
// demand, and hands events whose completion the test controls.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "core/runtime.h"

namespace torch_uvm {

class HostRuntime : public Runtime {
 public:
  struct Counters {
    std::size_t allocations = 0, frees = 0, advises = 0, prefetches = 0,
                event_records = 0, event_queries = 0, event_syncs = 0,
                events_created = 0, events_destroyed = 0, flag_waits = 0,
                flag_writes = 0, host_allocations = 0;
    // memory_info calls per device: on CUDA each one needs a context there.
    std::map<DeviceIndex, std::size_t> memory_info_reads;
  };

  // `devices` fake GPUs, each with `memory_per_device` bytes free.
  explicit HostRuntime(int devices = 1, std::size_t memory_per_device = 1ull << 30);
  ~HostRuntime() override;

  std::string name() const override { return "host"; }
  void* allocate_managed(std::size_t bytes) override;
  void free_managed(void* ptr) override;
  void* allocate_host(std::size_t bytes) override;
  void free_host(void* ptr) override;
  void advise(const void* ptr, std::size_t bytes, Advice advice,
              DeviceIndex device) override;
  void prefetch(const void* ptr, std::size_t bytes, DeviceIndex target,
                StreamRef stream) override;
  EventHandle create_event(DeviceIndex device) override;
  void destroy_event(EventHandle event) override;
  void record_event(EventHandle event, StreamRef stream) override;
  bool query_event(EventHandle event) override;
  void synchronize_event(EventHandle event) override;
  void stream_wait_event(StreamRef stream, EventHandle event) override;
  StreamRef create_stream(DeviceIndex device) override;
  void destroy_stream(StreamRef) override {}
  void synchronize_stream(StreamRef stream) override;
  FlagHandle create_flag() override;
  void destroy_flag(FlagHandle flag) override;
  // Host streams run at once, except that a stream waiting on a flag holds
  // back what is recorded on it after the wait: an event recorded there
  // completes only once the flag reaches the value, and synchronizing the
  // event or the stream waits for that (RuntimeError after 10 s: a flag
  // that is never written would hang a GPU stream). A write lands now.
  void stream_wait_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) override;
  void stream_write_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) override;
  void copy(void* dst, const void* src, std::size_t bytes, StreamRef stream,
            bool synchronous, CopyKind kind) override;
  void enable_peer_access(DeviceIndex, DeviceIndex) override {}
  // Host streams carry no device: the fallback always stands.
  DeviceIndex stream_device(std::uintptr_t, DeviceIndex fallback) override { return fallback; }
  int device_count() override { return devices_; }
  DeviceIndex current_device() override { return 0; }
  DeviceMemoryInfo memory_info(DeviceIndex device) override;

  // --- test controls ---
  // When false, recorded events stay incomplete until complete_events().
  void set_auto_complete_events(bool on);
  // Completes every event recorded so far on `stream` (all streams if null).
  void complete_events(const StreamRef* stream = nullptr);
  // The next `n` allocate_managed calls return nullptr (device OOM).
  void fail_next_allocations(int n) { fail_next_ = n; }
  // The next `n` allocate_host calls return nullptr (the host cannot pin).
  void fail_next_host_allocations(int n) { fail_next_host_ = n; }
  std::size_t host_bytes_live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t sum = 0;
    for (const auto& [p, n] : host_live_) sum += n;
    return sum;
  }
  // The next `n` prefetch calls throw RuntimeError.
  void fail_next_prefetches(int n) { fail_prefetch_ = n; }
  // While held, prefetch calls block (a driver holding the calling thread).
  void hold_prefetches(bool hold);
  // Flags are not supported (create_flag returns nullptr).
  void disable_flags() { flags_supported_ = false; }
  // Prefetches in call order: (ptr, bytes, target, stream).
  struct PrefetchCall {
    const void* ptr;
    std::size_t bytes;
    DeviceIndex target;
    StreamRef stream;
  };
  std::vector<PrefetchCall> prefetch_log() const;
  Counters counters() const;
  std::size_t bytes_in_use() const;
  // Everything advise() was told for ranges starting at `ptr`.
  std::vector<std::pair<Advice, DeviceIndex>> advice_for(const void* ptr) const;

 private:
  using FlagWait = std::pair<FlagHandle, std::uint32_t>;
  struct Event {
    bool complete = true;
    StreamRef stream;
    std::vector<FlagWait> waits;  // the stream's flag waits when recorded
  };
  static bool satisfied(const std::vector<FlagWait>& waits);
  // Waits (without the lock) until `waits` are satisfied; throws after 10 s.
  void wait_for_flags(std::vector<FlagWait> waits);
  const int devices_;
  const std::size_t memory_per_device_;
  mutable std::mutex mutex_;
  bool auto_complete_ = true;
  std::atomic<int> fail_next_{0};
  std::atomic<int> fail_next_host_{0};
  std::atomic<int> fail_prefetch_{0};
  bool hold_prefetches_ = false;
  std::condition_variable prefetch_released_;
  std::atomic<bool> flags_supported_{true};
  std::uintptr_t next_stream_ = 0x1000;
  std::vector<PrefetchCall> prefetch_log_;
  std::map<StreamRef, std::vector<FlagWait>> flag_waits_;  // unsatisfied, per stream
  std::map<void*, std::size_t> live_;
  std::map<void*, std::size_t> host_live_;  // allocate_host's
  std::size_t in_use_ = 0;
  std::set<Event*> events_;
  std::map<const void*, std::vector<std::pair<Advice, DeviceIndex>>> advice_;
  Counters counters_;
};

}  // namespace torch_uvm
