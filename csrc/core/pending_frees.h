// Stream-ordered reuse across streams. A block freed on its own stream is
// reusable at once (later work on that stream is ordered after the free). A
// block that other streams used (record_stream) is parked here: an event is
// recorded on each of those streams, and the block returns to its pool only
// when all of them completed. Nothing here synchronizes the device; the events
// are polled when the allocator next runs, or waited on by empty_cache().
//
// Failures never lose a block or let one be reused early: a stream whose
// event cannot be recorded is synchronized instead; if even that fails, the
// block waits in a retry list until a later attempt fences it. A failed
// query counts as "not yet".
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/block.h"
#include "core/runtime.h"

namespace torch_uvm {

class PendingFrees {
 public:
  struct PendingEvent {
    EventHandle event;
    DeviceIndex device;
    Block* block;
  };

  explicit PendingFrees(Runtime& runtime) : runtime_(runtime) {}
  ~PendingFrees();
  PendingFrees(const PendingFrees&) = delete;
  PendingFrees& operator=(const PendingFrees&) = delete;

  // Parks the block (kPendingFree) until the work queued so far on every
  // stream in block->stream_uses is done. Returns true if that is already
  // so (every stream was fenced by synchronizing): the caller reuses the
  // block at once. Never throws.
  bool defer(Block* block);

  // Blocks whose events have all completed, removed from the parked set;
  // retries the fences that could not be made before. Polls without
  // waiting; never throws.
  std::vector<Block*> take_completed();

  // Waiting for every event, in three steps so that the caller can wait
  // without its lock: detach() takes the events out (blocks stay parked),
  // wait() synchronizes them (touching nothing shared), settle() returns the
  // blocks all of whose events completed and re-attaches any event whose
  // wait failed. wait() returns the first failure's message, or "".
  std::vector<PendingEvent> detach();
  std::string wait(std::vector<PendingEvent>& events, std::vector<bool>& done);
  std::vector<Block*> settle(const std::vector<PendingEvent>& events,
                             const std::vector<bool>& done);

  bool empty() const { return events_.empty() && retry_.empty(); }
  std::size_t parked_events() const { return events_.size(); }
  // Blocks waiting for a fence that could not be made yet.
  const std::vector<Block*>& unfenced() const { return retry_; }

 private:
  EventHandle acquire_event(DeviceIndex device);
  void release_event(DeviceIndex device, EventHandle event);
  // Fences `stream` for `block`: an event, or else a synchronization.
  // False if neither could be done.
  bool fence(Block* block, StreamRef stream);
  // Fences what could not be fenced before; returns the blocks now ready.
  std::vector<Block*> retry_unfenced();
  void count_down(const PendingEvent& p, std::vector<Block*>& ready);

  Runtime& runtime_;
  std::vector<PendingEvent> events_;
  std::vector<Block*> retry_;  // kPendingFree, streams left to fence in stream_uses
  // Events are reused: creating one is a driver call.
  std::map<DeviceIndex, std::vector<EventHandle>> spare_events_;
};

}  // namespace torch_uvm
