// Where a prefetch leaves the caller's thread.
//
// cudaMemPrefetchAsync of host-resident pages holds the calling thread about
// as long as the transfer takes (23 ms per GiB on an H100), so a zero-copy
// `.to('cuda', non_blocking=True)` that prefetches is not asynchronous at all.
// PrefetchQueue hands the call to a worker thread and keeps the consumer's
// stream ordered after it with a flag (stream memory operations):
//
//   caller:  ticket = ++lane.issued; consumer waits until flag >= ticket; return
//   worker:  prefetch on the lane's own stream; that stream writes ticket to flag
//
// so kernels queued on the consumer stream after the move start once the data
// is resident, and the caller returns in microseconds. A prefetch never
// changes data: the wait only spares those kernels from faulting on pages the
// prefetch is moving. Whatever fails, the worker writes the flag (from the
// host if the stream cannot), so a consumer stream never waits forever.
//
// One lane per consumer device: a flag, a stream of the queue's own and a
// ticket counter. One worker thread serves the lanes in submission order, so
// each lane's flag only grows.
//
// Measured on H100 (benchmarks/results): issuing one range in pieces, one
// after another or from several threads at once, is slower than one call;
// the driver serializes the migrations.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/runtime.h"

namespace torch_uvm {

class PrefetchQueue {
 public:
  struct Options {
    // Issue a prefetch in pieces of this many bytes (0: in one call; measured
    // fastest on H100).
    std::size_t chunk_bytes = 0;
  };
  struct Counters {
    std::size_t submitted = 0, issued = 0, failed = 0;
  };

  PrefetchQueue(Runtime& runtime, Options options);
  ~PrefetchQueue();  // stop()
  PrefetchQueue(const PrefetchQueue&) = delete;
  PrefetchQueue& operator=(const PrefetchQueue&) = delete;

  // Orders `consumer` (a GPU stream) after a prefetch of [ptr, ptr + bytes)
  // to `target`, which the worker issues later. Returns false, having done
  // nothing, when the runtime cannot make the stream wait (then the caller
  // prefetches itself) or the queue is stopped.
  bool submit(const void* ptr, std::size_t bytes, DeviceIndex target, StreamRef consumer);

  // Returns once every prefetch submitted so far was issued and its flag
  // write queued.
  void drain();
  // drain(), then ends the worker. Later submits return false.
  void stop();

  // While paused (pauses nest), submit returns false: the caller prefetches
  // on its own thread, and no stream waits on the worker. pause() returns
  // once everything accepted before it was issued. The allocator pauses the
  // queue while it frees segments: a free may synchronize the device, which
  // must not wait on a stream that waits on the worker.
  void pause();
  void resume();

  // The first failure since the last call ("prefetch of N bytes to cuda:0
  // failed: ..."), for the caller to report; failures cost speed only.
  std::optional<std::string> take_error();
  Counters counters() const;

 private:
  struct Lane {
    FlagHandle flag = nullptr;
    StreamRef stream{};
    bool has_stream = false;
    std::uint32_t issued = 0;
  };
  struct Job {
    const void* ptr;
    std::size_t bytes;
    DeviceIndex target;
    Lane* lane;
    DeviceIndex device;
    std::uint32_t ticket;
  };

  void run();
  void issue(const Job& job);
  void release_flag(const Job& job);

  Runtime& runtime_;
  const Options options_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::deque<Job> jobs_;
  std::map<DeviceIndex, Lane> lanes_;  // nodes are stable: jobs point at them
  bool busy_ = false;
  bool stopping_ = false;
  int pauses_ = 0;
  bool unsupported_ = false;
  Counters counters_;
  std::optional<std::string> error_;
  std::thread worker_;
};

}  // namespace torch_uvm
