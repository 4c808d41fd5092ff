// Memory statistics with the keys and meanings of torch.cuda.memory_stats(), so
// that tools written for PyTorch's allocator read ours unchanged.
//   allocation / allocated_bytes: blocks handed to users (a free() counts at once)
//   active / active_bytes: allocated, plus freed blocks still waiting on events
//   segment / reserved_bytes: ranges obtained from the runtime
//   inactive_split / inactive_split_bytes: free blocks inside split segments
//   requested_bytes: what users asked for, before rounding
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/types.h"

namespace torch_uvm {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // total increases
  int64_t freed = 0;      // total decreases

  void increase(int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

enum StatPool { kAllPools = 0, kSmallPool = 1, kLargePool = 2, kNumStatPools = 3 };

// One Stat for all pools, one for the small pool, one for the large pool.
struct StatArray {
  std::array<Stat, kNumStatPools> pools;
  void increase(bool small, int64_t n) {
    pools[kAllPools].increase(n);
    pools[small ? kSmallPool : kLargePool].increase(n);
  }
  void decrease(bool small, int64_t n) {
    pools[kAllPools].decrease(n);
    pools[small ? kSmallPool : kLargePool].decrease(n);
  }
  const Stat& all() const { return pools[kAllPools]; }
};

struct MemoryStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes,
      requested_bytes;
  StatArray oversize_allocations, oversize_segments;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  int64_t max_split_size = 0;
  // torch_uvm's own: the cap on reserved bytes.
  int64_t cap_bytes = 0;

  void reset_peak();
  void reset_accumulated();
};

// The statistics kept twice: for everything, and per home (the CPU and each
// GPU), so that torch.cuda.memory_stats(d) counts the allocations whose home
// is GPU d while torch_uvm.memory_stats() still sees the whole picture. Peaks
// are per book: the peak of the total is not the sum of the homes' peaks.
class StatsBook {
 public:
  explicit StatsBook(int devices) : homes_(static_cast<std::size_t>(devices) + 1) {}

  const MemoryStats& total() const { return total_; }
  // kCpuDevice or a GPU index; throws std::out_of_range for another.
  const MemoryStats& home(DeviceIndex home) const { return homes_.at(slot(home)); }

  void increase(StatArray MemoryStats::*field, DeviceIndex home, bool small, int64_t n) {
    (total_.*field).increase(small, n);
    (homes_[slot(home)].*field).increase(small, n);
  }
  void decrease(StatArray MemoryStats::*field, DeviceIndex home, bool small, int64_t n) {
    (total_.*field).decrease(small, n);
    (homes_[slot(home)].*field).decrease(small, n);
  }
  void count(int64_t MemoryStats::*field, DeviceIndex home) {
    ++(total_.*field);
    ++(homes_[slot(home)].*field);
  }
  // Values that are settings, not counts: the same in every book.
  void set(int64_t MemoryStats::*field, int64_t value) {
    total_.*field = value;
    for (MemoryStats& s : homes_) s.*field = value;
  }
  // Resets the total and every home, or one home only.
  void reset_peak();
  void reset_peak(DeviceIndex home);
  void reset_accumulated();
  void reset_accumulated(DeviceIndex home);

 private:
  static std::size_t slot(DeviceIndex home) { return static_cast<std::size_t>(home + 1); }
  MemoryStats total_;
  std::vector<MemoryStats> homes_;  // [0] the CPU, [1 + d] GPU d
};

// The flat "name.pool.metric" -> value map of torch.cuda.memory_stats().
std::vector<std::pair<std::string, int64_t>> flatten(const MemoryStats& stats);

}  // namespace torch_uvm
