#include "core/prefetch_queue.h"

#include <algorithm>
#include <exception>

#include "core/errors.h"

namespace torch_uvm {

PrefetchQueue::PrefetchQueue(Runtime& runtime, Options options)
    : runtime_(runtime), options_(options), worker_([this] { run(); }) {}

PrefetchQueue::~PrefetchQueue() {
  stop();
  // Callers destroy the queue only once the consumer streams are done with
  // the flags (tests, or never: the torch glue keeps its queue for the
  // process's life).
  for (auto& [device, lane] : lanes_) {
    try {
      if (lane.has_stream) {
        runtime_.synchronize_stream(lane.stream);
        runtime_.destroy_stream(lane.stream);
      }
      if (lane.flag != nullptr) runtime_.destroy_flag(lane.flag);
    } catch (...) {
      // The runtime may be shutting down with the process.
    }
  }
}

bool PrefetchQueue::submit(const void* ptr, std::size_t bytes, DeviceIndex target,
                           StreamRef consumer) {
  TORCH_UVM_CHECK_ARG(consumer.device != kCpuDevice,
                      "PrefetchQueue::submit: the consumer must be a GPU stream");
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_ || unsupported_ || pauses_ > 0) return false;
  Lane& lane = lanes_[consumer.device];
  if (lane.flag == nullptr) {
    lane.flag = runtime_.create_flag();
    if (lane.flag == nullptr) {
      unsupported_ = true;
      return false;
    }
  }
  const std::uint32_t ticket = lane.issued + 1;
  try {
    runtime_.stream_wait_flag(consumer, lane.flag, ticket);
  } catch (const std::exception&) {
    // Streams cannot wait on memory here: prefetch on the caller's thread
    // from now on. Nothing waits on `ticket`, so it is not taken.
    unsupported_ = true;
    return false;
  }
  lane.issued = ticket;
  jobs_.push_back({ptr, bytes, target, &lane, consumer.device, ticket});
  ++counters_.submitted;
  work_.notify_one();
  return true;
}

void PrefetchQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) break;  // stopping, and everything was issued
    Job job = jobs_.front();
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    issue(job);
    lock.lock();
    busy_ = false;
    ++counters_.issued;
    if (jobs_.empty()) idle_.notify_all();
  }
  idle_.notify_all();
}

void PrefetchQueue::issue(const Job& job) {
  // Only this thread touches a lane's stream.
  Lane& lane = *job.lane;
  try {
    if (!lane.has_stream) {
      lane.stream = runtime_.create_stream(job.device);
      lane.has_stream = true;
    }
    const std::size_t chunk = options_.chunk_bytes ? options_.chunk_bytes : job.bytes;
    const char* p = static_cast<const char*>(job.ptr);
    for (std::size_t done = 0; done < job.bytes; done += chunk) {
      runtime_.prefetch(p + done, std::min(chunk, job.bytes - done), job.target, lane.stream);
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.failed;
    if (!error_) {
      error_ = detail::concat("prefetch of ", format_bytes(job.bytes), " to ",
                              device_name(job.target), " failed: ", e.what());
    }
  }
  release_flag(job);
}

void PrefetchQueue::release_flag(const Job& job) {
  Lane& lane = *job.lane;
  if (lane.has_stream) {
    try {
      runtime_.stream_write_flag(lane.stream, lane.flag, job.ticket);
      return;
    } catch (...) {
    }
    // Let earlier (smaller) stream writes land first, so the flag never goes
    // back below this ticket.
    try {
      runtime_.synchronize_stream(lane.stream);
    } catch (...) {
    }
  }
  __atomic_store_n(lane.flag, job.ticket, __ATOMIC_SEQ_CST);
}

void PrefetchQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return jobs_.empty() && !busy_; });
}

void PrefetchQueue::pause() {
  std::unique_lock<std::mutex> lock(mutex_);
  ++pauses_;  // from here no submit is accepted
  idle_.wait(lock, [this] { return jobs_.empty() && !busy_; });
}

void PrefetchQueue::resume() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pauses_ > 0) --pauses_;
}

void PrefetchQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
  }
  work_.notify_all();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

std::optional<std::string> PrefetchQueue::take_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto e = std::move(error_);
  error_.reset();
  return e;
}

PrefetchQueue::Counters PrefetchQueue::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace torch_uvm
