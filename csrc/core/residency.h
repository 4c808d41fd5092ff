// What decides eviction: residency budgets per GPU over the memory torch_uvm
// brings there, and the least recently used ranges that leave when a new one
// would exceed a budget (what stays resident of an offloaded module:
// core/resident_plan.h). Policy only: the glue carries out the evictions it
// returns (torch/stream_executor.h for offloaded modules, torch_uvm/
// residency.py for batches).
//
// A GPU has an optional limit, and any number of shares: each offloaded
// module streams within a share of its own, sized by its budget. Shares
// never take from each other: a range admitted to a share evicts only that
// share's ranges. The device's own share (kDeviceShare: batches, bring) gets
// what the limit leaves over the shares, or no bound without a limit. The
// shares of a GPU add up to at most its limit, or, without one, to the
// ceiling the caller gives (the managed memory cap).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/residency_timeline.h"
#include "core/types.h"

namespace torch_uvm {

// How a range leaves a GPU. A range not written since it arrived only lets
// go of its GPU copy (a slot freed, a read-mostly duplicate dropped); a
// written one is sent home first.
enum class Eviction { kDrop = 0, kWriteHome = 1 };

struct EvictionStep {
  std::uintptr_t address;
  std::size_t bytes;
  Eviction how;
};

using ShareId = std::uint64_t;
constexpr ShareId kDeviceShare = 0;  // per GPU: what the limit leaves over the shares

struct ResidencyStats {
  std::size_t limit = 0;  // the GPU's limit, or the share's budget; 0: none
  std::size_t resident_bytes = 0;
  // Evicted with a copy home under way: the GPU memory they held is not
  // free before the copy passes (ResidencyBudget::leaving).
  std::size_t leaving_bytes = 0;
  std::size_t peak_resident_bytes = 0;     // of resident and leaving bytes together
  std::size_t prefetched_bytes = 0;        // brought to the GPU, all time
  std::size_t evictions[2] = {0, 0};       // by Eviction
  std::size_t evicted_bytes[2] = {0, 0};   // by Eviction
  std::size_t discards = 0;                // dead ranges let go (a gradient set to None)
  std::size_t discarded_bytes = 0;
};

struct ShareInfo {
  ShareId id;
  std::string holder;  // who holds it (an offloaded module's class name)
  std::size_t budget;
  std::size_t resident_bytes;
};

// Internally synchronized: the copy kernels read it from any thread.
class ResidencyBudget {
 public:
  // The GPU's limit in bytes; nullopt removes it. A limit below the shares'
  // sum is refused (InvalidArgument naming the holders). A limit below what
  // is resident now is allowed: the next admit evicts down to it.
  void set_limit(DeviceIndex device, std::optional<std::size_t> bytes);
  std::optional<std::size_t> limit(DeviceIndex device) const;
  // Whether anything streams on `device` under a budget: a limit or a share.
  bool has_budget(DeviceIndex device) const;

  // A share of `bytes` on `device` for `holder`. Refused (InvalidArgument,
  // naming who holds the GPU and how much) when the shares would add up to
  // more than the limit, or, without a limit, than `ceiling`.
  ShareId open_share(DeviceIndex device, std::size_t bytes, const std::string& holder,
                     std::size_t ceiling);
  // Its ranges leave the books (the caller let go of their memory).
  void close_share(ShareId share);
  // The GPU an open share is on (InvalidArgument if it is not open).
  DeviceIndex device_of(ShareId share) const;
  std::vector<ShareInfo> shares(DeviceIndex device) const;

  // `bytes` at `address` are about to be brought to `device` within `share`
  // (kDeviceShare: the device's own). Returns the ranges of that share to
  // evict first, least recently used first, never a busy one. An admitted
  // range counts as resident and most recently used. Already resident in
  // the share: only touched. Throws InvalidArgument when the range cannot
  // fit even after evicting every range of the share that is not busy and
  // the copies home under way passed (leaving).
  // `arrives`: its bytes cross to the GPU (counted in prefetched_bytes);
  // false for memory made on the GPU (a new gradient) that is only counted:
  // the peak then counts it beside the written ranges it evicts, whose
  // memory is held until their copies home pass.
  std::vector<EvictionStep> admit(DeviceIndex device, std::uintptr_t address, std::size_t bytes,
                                  bool written, ShareId share = kDeviceShare,
                                  bool arrives = true);

  // `bytes` of `share` were evicted and their copy home is under way: their
  // GPU memory is held until it passes, and counts against the share as a
  // resident range does, never evicted: admit() makes room around it, and
  // the caller waits for copies home while excess() says so. left(): the
  // copy passed.
  void leaving(DeviceIndex device, ShareId share, std::size_t bytes);
  void left(DeviceIndex device, ShareId share, std::size_t bytes);
  // How many bytes the share's resident and leaving ranges, and `extra`
  // more, hold over its budget: the bytes of copies home that must pass
  // before they fit. 0 within the budget (or without one), and 0 when even
  // every copy home passing would leave it over (ranges in use hold it
  // there: waiting would not help). Before drawing GPU memory for a range
  // just admitted, wait for copies home until it is 0: the GPU then never
  // holds more than the budget, in the books and in memory.
  std::size_t excess(DeviceIndex device, ShareId share, std::size_t extra = 0) const;
  // Room for `bytes` that work about to run will make on the GPU (a
  // submodule's gradients in its backward, an optimizer's first states),
  // admitted when they exist: the ranges of the share to evict first, as
  // admit() would; then wait while excess(device, share, bytes) > 0.
  std::vector<EvictionStep> make_room(DeviceIndex device, ShareId share, std::size_t bytes);

  // The share's least recently used range not busy (and, given `which`,
  // that it accepts) leaves, as an admit's eviction would send it: for room
  // the books already have, but not in one piece (core/slot_arena.h).
  // nullopt if none is left.
  std::optional<EvictionStep> evict_least_recent(
      DeviceIndex device, ShareId share,
      const std::function<bool(std::uintptr_t)>& which = nullptr);
  // An admitted range did not arrive after all (its bring was put off):
  // it leaves the books, and the bytes it would have brought too.
  void withdraw(std::uintptr_t address);

  // A range in use by work still running may not be evicted.
  void set_busy(std::uintptr_t address, bool busy);
  // Written since it arrived: it must go home when evicted.
  void mark_written(std::uintptr_t address);
  // Went home ahead of its eviction (written back): now clean.
  void mark_clean(std::uintptr_t address);
  // The range left without an eviction (freed, or moved by the user).
  void forget(std::uintptr_t address);
  // The range died (nothing to keep, nothing to move): forgotten, counted.
  void discard(std::uintptr_t address);
  // The range leaves now, as an eviction would send it (counted as one).
  // Returns how, or nullopt if it was not resident.
  std::optional<Eviction> evict(std::uintptr_t address);

  bool is_resident(DeviceIndex device, std::uintptr_t address) const;
  bool is_busy(std::uintptr_t address) const;
  // The GPU's figures (every share), or one share's (`limit` is its budget).
  ResidencyStats stats(DeviceIndex device) const;
  ResidencyStats share_stats(ShareId share) const;
  void reset_peak(DeviceIndex device);

  // The name a range shows in a timeline (a submodule's, a tensor's), until
  // unlabel. Kept for ranges not resident too: they may arrive later.
  void label(std::uintptr_t address, std::string name);
  void unlabel(std::uintptr_t address);
  // Record every arrival and departure, at most `capacity` events (the
  // oldest go first); a running recording starts anew.
  void start_timeline(std::size_t capacity);
  // The recording so far (oldest first) and how many were dropped; stops it.
  std::vector<ResidencyEvent> take_timeline(std::size_t* dropped = nullptr);

 private:
  struct Range {
    DeviceIndex device;
    ShareId share;
    std::uintptr_t address;
    std::size_t bytes;
    bool written;
    bool busy;
  };
  using Lru = std::list<Range>;  // front: least recently used
  struct Share {
    DeviceIndex device;
    std::string holder;
    std::optional<std::size_t> budget;  // nullopt: the device share without a limit
    Lru lru;
    ResidencyStats stats;
  };
  struct PerDevice {
    std::optional<std::size_t> limit;
    std::vector<ShareId> shares;  // open shares, kDeviceShare excluded
    ResidencyStats stats;
  };

  PerDevice& per_device(DeviceIndex device);
  Share& device_share(DeviceIndex device);
  Share& share_of(DeviceIndex device, ShareId id);
  const Share& open_share_of(DeviceIndex device, ShareId id) const;  // not kDeviceShare
  // What the share holds on the GPU: resident and leaving bytes.
  static std::size_t held(const Share& s);
  std::size_t excess_of(const Share& s, std::size_t extra) const;
  std::size_t shares_sum(const PerDevice& d) const;
  std::optional<std::size_t> budget_of(const Share& s) const;
  std::string holders(const PerDevice& d) const;
  // The figures a range counts in: its share's and its GPU's.
  std::array<ResidencyStats*, 2> figures_of(const Range& r);
  void count_eviction(const Range& r, Eviction how);
  // The range leaves, counted as an eviction by how it must (every eviction
  // goes through here).
  EvictionStep evict_range(Lru::iterator it);
  // Evicts the share's least recently used ranges not busy until `bytes`
  // more fit beside its resident and leaving ones (or none is left).
  void evict_for(Share& s, std::size_t bytes, std::size_t budget,
                 std::vector<EvictionStep>& steps);
  // Every change of resident bytes goes through these two, which record it.
  void erase(Lru::iterator it, ResidencyEvent::Kind why);
  void note(const Range& r, ResidencyEvent::Kind kind);

  mutable std::mutex mutex_;
  std::map<DeviceIndex, PerDevice> devices_;
  std::map<DeviceIndex, Share> device_shares_;
  std::unordered_map<ShareId, Share> shares_;
  ShareId next_share_ = 1;
  std::unordered_map<std::uintptr_t, Lru::iterator> where_;
  std::unordered_map<std::uintptr_t, std::string> labels_;
  std::unique_ptr<ResidencyTimeline> timeline_;  // while recording
};

}  // namespace torch_uvm
