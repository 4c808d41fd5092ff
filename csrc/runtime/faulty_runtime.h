// FaultyRuntime: an adaptor over any Runtime that makes chosen calls fail,
// on request or at random, to test the allocator's error paths against the
// host runtime in CI and against CUDA on the GPU. A failed call throws
// RuntimeError without reaching the runtime below (allocate_managed returns
// nullptr, as on out-of-memory, or throws, alternately). Tests can also run
// a hook before a call reaches the runtime below, e.g. to block it.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <random>

#include "core/runtime.h"

namespace torch_uvm {

class FaultyRuntime : public Runtime {
 public:
  enum Call {
    kAllocate, kFree, kAdvise, kPrefetch, kEventCreate, kEventRecord, kEventQuery,
    kEventSync, kStreamWait, kFlagWrite, kStreamSync, kNumCalls
  };

  explicit FaultyRuntime(std::shared_ptr<Runtime> inner) : inner_(std::move(inner)) {}

  // The next `n` calls of `call` fail.
  void fail_next(Call call, int n) { next_[call] = n; }
  // Every call of the kinds in `mask` (bit per Call) fails with probability p.
  void fail_randomly(double p, unsigned mask, std::uint64_t seed);
  void stop_failing();
  // Runs before each call of `call` reaches the runtime below.
  void before(Call call, std::function<void()> hook);
  std::size_t injected() const { return injected_.load(); }
  Runtime& inner() { return *inner_; }

  std::string name() const override { return "faulty " + inner_->name(); }
  void* allocate_managed(std::size_t bytes) override;
  void free_managed(void* ptr) override;
  void* allocate_host(std::size_t bytes) override;
  void free_host(void* ptr) override;
  void advise(const void* ptr, std::size_t bytes, Advice advice, DeviceIndex device) override;
  void prefetch(const void* ptr, std::size_t bytes, DeviceIndex target, StreamRef stream) override;
  EventHandle create_event(DeviceIndex device) override;
  void destroy_event(EventHandle event) override { inner_->destroy_event(event); }
  void record_event(EventHandle event, StreamRef stream) override;
  bool query_event(EventHandle event) override;
  void synchronize_event(EventHandle event) override;
  void stream_wait_event(StreamRef stream, EventHandle event) override;
  StreamRef create_stream(DeviceIndex device) override { return inner_->create_stream(device); }
  void destroy_stream(StreamRef stream) override { inner_->destroy_stream(stream); }
  void synchronize_stream(StreamRef stream) override;
  FlagHandle create_flag() override { return inner_->create_flag(); }
  void destroy_flag(FlagHandle flag) override { inner_->destroy_flag(flag); }
  void stream_wait_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) override;
  void stream_write_flag(StreamRef stream, FlagHandle flag, std::uint32_t value) override;
  void copy(void* dst, const void* src, std::size_t bytes, StreamRef stream,
            bool synchronous, CopyKind kind) override {
    inner_->copy(dst, src, bytes, stream, synchronous, kind);
  }
  void enable_peer_access(DeviceIndex device, DeviceIndex peer) override {
    inner_->enable_peer_access(device, peer);
  }
  DeviceIndex stream_device(std::uintptr_t handle, DeviceIndex fallback) override {
    return inner_->stream_device(handle, fallback);
  }
  int device_count() override { return inner_->device_count(); }
  DeviceIndex current_device() override { return inner_->current_device(); }
  DeviceMemoryInfo memory_info(DeviceIndex device) override { return inner_->memory_info(device); }

 private:
  // Throws RuntimeError if this call is to fail; runs its hook otherwise.
  void enter(Call call);
  bool should_fail(Call call);

  std::shared_ptr<Runtime> inner_;
  std::array<std::atomic<int>, kNumCalls> next_{};
  std::atomic<unsigned> random_mask_{0};
  double probability_ = 0;
  std::mutex rng_mutex_;
  std::mt19937_64 rng_;
  std::atomic<std::size_t> injected_{0};
  std::array<std::function<void()>, kNumCalls> hooks_;
};

}  // namespace torch_uvm
