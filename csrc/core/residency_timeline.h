// What the residency policy did, in order, for a profile (torch_uvm.profile):
// every range that arrived on a GPU or left it, when (the host's steady
// clock when the policy decided it; its copy runs on a stream after), in
// which share, named by whoever streams it, and the bytes resident after.
// Recorded only while a profile asks for it, into a bounded ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/types.h"

namespace torch_uvm {

struct ResidencyEvent {
  enum Kind : std::uint8_t { kArrive, kAdopt, kDrop, kWriteHome, kDiscard, kForget };
  std::int64_t time_ns;
  DeviceIndex device;
  std::uint64_t share;       // ShareId (residency.h); 0: the device's own
  std::uintptr_t address;
  std::size_t bytes;
  Kind kind;
  std::size_t share_resident;   // the share's resident bytes after it
  std::size_t device_resident;  // the GPU's resident bytes after it
  std::string label;            // a submodule's or tensor's name, or ""
};

// "arrive", "adopt" (made on the GPU, counted), "drop", "write_home",
// "discard" (died), "forget" (left the books without an eviction).
const char* kind_name(ResidencyEvent::Kind kind);

class ResidencyTimeline {
 public:
  explicit ResidencyTimeline(std::size_t capacity) : capacity_(capacity) {}
  // Past capacity, the oldest event goes (counted in dropped()).
  void record(ResidencyEvent e);
  const std::deque<ResidencyEvent>& events() const { return events_; }
  std::size_t dropped() const { return dropped_; }

 private:
  std::size_t capacity_;
  std::deque<ResidencyEvent> events_;
  std::size_t dropped_ = 0;
};

}  // namespace torch_uvm
