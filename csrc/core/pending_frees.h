// Stream-ordered reuse across streams. A block freed on its own stream is
// reusable at once (later work on that stream is ordered after the free). A
// block that other streams used (record_stream) is parked here: an event is
// recorded on each of those streams, and the block returns to its pool only
// when all of them completed. Nothing here synchronizes the device; the events
// are polled when the allocator next runs, or waited on by empty_cache().
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "core/block.h"
#include "core/runtime.h"

namespace torch_uvm {

class PendingFrees {
 public:
  explicit PendingFrees(Runtime& runtime) : runtime_(runtime) {}
  ~PendingFrees();
  PendingFrees(const PendingFrees&) = delete;
  PendingFrees& operator=(const PendingFrees&) = delete;

  // Records an event on every stream in block->stream_uses and parks the block.
  void defer(Block* block);

  // Blocks whose events have all completed, removed from the parked set.
  // Polls without waiting.
  std::vector<Block*> take_completed();

  // Waits for every outstanding event; returns all parked blocks.
  std::vector<Block*> take_all_synchronized();

  bool empty() const { return events_.empty(); }
  std::size_t parked_events() const { return events_.size(); }

 private:
  EventHandle acquire_event(DeviceIndex device);
  void release_event(DeviceIndex device, EventHandle event);

  struct PendingEvent {
    EventHandle event;
    DeviceIndex device;
    Block* block;
  };

  Runtime& runtime_;
  std::vector<PendingEvent> events_;
  // Events are reused: creating one is a driver call.
  std::map<DeviceIndex, std::vector<EventHandle>> spare_events_;
};

}  // namespace torch_uvm
