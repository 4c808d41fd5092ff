// PyTorch's memory history over the allocator's events
// (core/allocator_events.h): torch.cuda.memory._record_memory_history()
// turns it on, and snapshots carry its per-device traces and the stack of
// every live block, in CUDACachingAllocator's format, so that the memory
// visualizer reads them.
//
// Stacks are gathered by PyTorch's context recorder, which may take the GIL.
// So they are gathered before the allocator's lock is taken (gather_*), and
// the observer, which runs under that lock, only files what was gathered.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/ApproximateClock.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "core/allocator_events.h"

namespace torch_uvm {

class MemoryHistory {
 public:
  using TraceEntry = c10::CachingDeviceAllocator::TraceEntry;
  using Context = std::shared_ptr<c10::GatheredContext>;

  explicit MemoryHistory(int device_count) : traces_(static_cast<std::size_t>(device_count)) {}

  void record(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder,
              std::size_t max_entries, c10::CachingDeviceAllocator::RecordContext when,
              bool clear, const std::vector<std::string>& skip_actions);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Whether events must reach on_event at all (history or a tracker).
  bool observing() const { return observing_.load(std::memory_order_relaxed); }

  // Stacks for the next allocation / free on this thread, gathered before
  // the allocator's lock; nullptr when not recording them.
  Context gather_for_alloc();
  Context gather_for_free();
  // Files the calling thread's gathered stack under the next event.
  static void stage(Context context);

  // The allocator's observer.
  void on_event(const AllocatorEvent& event);
  void add_tracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker);

  // The stack recorded when the block at `ptr` was allocated, if any.
  Context context_of(const void* ptr) const;
  // The traces, oldest first, one list per GPU.
  std::vector<std::vector<TraceEntry>> traces() const;

 private:
  void append(TraceEntry entry);

  std::atomic<bool> enabled_{false};
  std::atomic<bool> observing_{false};
  mutable std::mutex mutex_;
  c10::CachingDeviceAllocator::CreateContextFn recorder_ = nullptr;
  c10::CachingDeviceAllocator::RecordContext when_ =
      c10::CachingDeviceAllocator::RecordContext::NEVER;
  std::size_t max_entries_ = 0;
  std::set<TraceEntry::Action> skip_;
  std::vector<std::deque<TraceEntry>> traces_;  // per GPU, oldest first
  std::map<const void*, Context> live_contexts_;
  std::vector<c10::CachingDeviceAllocator::AllocatorTraceTracker> trackers_;
};

}  // namespace torch_uvm
