#include "core/residency.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "core/errors.h"

namespace torch_uvm {
namespace {

ResidencyEvent::Kind left_by(Eviction how) {
  return how == Eviction::kWriteHome ? ResidencyEvent::kWriteHome : ResidencyEvent::kDrop;
}

}  // namespace

ResidencyBudget::PerDevice& ResidencyBudget::per_device(DeviceIndex device) {
  return devices_[device];
}

ResidencyBudget::Share& ResidencyBudget::device_share(DeviceIndex device) {
  auto it = device_shares_.find(device);
  if (it == device_shares_.end()) {
    it = device_shares_.emplace(device, Share{device, "batches", std::nullopt, {}, {}}).first;
  }
  return it->second;
}

ResidencyBudget::Share& ResidencyBudget::share_of(DeviceIndex device, ShareId id) {
  if (id == kDeviceShare) return device_share(device);
  return const_cast<Share&>(open_share_of(device, id));
}

const ResidencyBudget::Share& ResidencyBudget::open_share_of(DeviceIndex device,
                                                             ShareId id) const {
  auto it = shares_.find(id);
  TORCH_UVM_CHECK_ARG(it != shares_.end(), "residency share ", id, " is not open");
  TORCH_UVM_CHECK_ARG(it->second.device == device, "residency share ", id, " is on cuda:",
                      it->second.device, ", not cuda:", device);
  return it->second;
}

DeviceIndex ResidencyBudget::device_of(ShareId share) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shares_.find(share);
  TORCH_UVM_CHECK_ARG(it != shares_.end(), "residency share ", share, " is not open");
  return it->second.device;
}

std::size_t ResidencyBudget::held(const Share& s) {
  return s.stats.resident_bytes + s.stats.leaving_bytes;
}

std::size_t ResidencyBudget::shares_sum(const PerDevice& d) const {
  std::size_t sum = 0;
  for (ShareId id : d.shares) sum += *shares_.at(id).budget;
  return sum;
}

// The device share's bound is what the limit leaves over the shares.
std::optional<std::size_t> ResidencyBudget::budget_of(const Share& s) const {
  if (s.budget) return s.budget;
  auto it = devices_.find(s.device);
  if (it == devices_.end() || !it->second.limit) return std::nullopt;
  const std::size_t taken = shares_sum(it->second);
  return *it->second.limit > taken ? *it->second.limit - taken : 0;
}

std::string ResidencyBudget::holders(const PerDevice& d) const {
  std::string out;
  for (ShareId id : d.shares) {
    const Share& s = shares_.at(id);
    out += detail::concat(out.empty() ? "" : ", ", s.holder, " (", *s.budget, " bytes)");
  }
  return out.empty() ? "nothing" : out;
}

void ResidencyBudget::set_limit(DeviceIndex device, std::optional<std::size_t> bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(device >= 0, "a residency budget is for a GPU, got device ", device);
  TORCH_UVM_CHECK_ARG(!bytes || *bytes > 0, "a residency budget must be positive");
  PerDevice& d = per_device(device);
  if (bytes) {
    const std::size_t taken = shares_sum(d);
    TORCH_UVM_CHECK_ARG(*bytes >= taken, "a residency limit of ", *bytes, " bytes on cuda:",
                        device, " is below the budgets of the offloads streaming there (",
                        taken, " bytes: ", holders(d), "): undo() one of them first, or "
                        "choose a larger limit");
  }
  d.limit = bytes;
  d.stats.limit = bytes.value_or(0);
}

std::optional<std::size_t> ResidencyBudget::limit(DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? std::nullopt : it->second.limit;
}

bool ResidencyBudget::has_budget(DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  return it != devices_.end() && (it->second.limit || !it->second.shares.empty());
}

ShareId ResidencyBudget::open_share(DeviceIndex device, std::size_t bytes,
                                    const std::string& holder, std::size_t ceiling) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(device >= 0, "a residency budget is for a GPU, got device ", device);
  TORCH_UVM_CHECK_ARG(bytes > 0, "a residency budget must be positive");
  PerDevice& d = per_device(device);
  const std::size_t bound = d.limit.value_or(ceiling);
  const std::size_t taken = shares_sum(d);
  TORCH_UVM_CHECK_ARG(taken + bytes <= bound, "a budget of ", bytes, " bytes for ", holder,
                      " does not fit on cuda:", device, " beside the offloads streaming there (",
                      holders(d), "): they hold ", taken, " of the ",
                      d.limit ? "residency limit's " : "managed memory cap's ", bound,
                      " bytes. Undo one of them, lower the budget",
                      d.limit ? ", or raise the limit (set_residency_limit)" : "");
  const ShareId id = next_share_++;
  Share s{device, holder, bytes, {}, {}};
  s.stats.limit = bytes;
  shares_.emplace(id, std::move(s));
  d.shares.push_back(id);
  return id;
}

void ResidencyBudget::close_share(ShareId share) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shares_.find(share);
  if (it == shares_.end()) return;
  while (!it->second.lru.empty()) erase(it->second.lru.begin(), ResidencyEvent::kForget);
  per_device(it->second.device).stats.leaving_bytes -= it->second.stats.leaving_bytes;
  auto& ids = per_device(it->second.device).shares;
  ids.erase(std::remove(ids.begin(), ids.end(), share), ids.end());
  shares_.erase(it);
}

std::vector<ShareInfo> ResidencyBudget::shares(DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ShareInfo> out;
  auto it = devices_.find(device);
  if (it == devices_.end()) return out;
  for (ShareId id : it->second.shares) {
    const Share& s = shares_.at(id);
    out.push_back({id, s.holder, *s.budget, s.stats.resident_bytes});
  }
  return out;
}

void ResidencyBudget::erase(Lru::iterator it, ResidencyEvent::Kind why) {
  Share& s = share_of(it->device, it->share);
  s.stats.resident_bytes -= it->bytes;
  devices_[it->device].stats.resident_bytes -= it->bytes;
  note(*it, why);
  where_.erase(it->address);
  s.lru.erase(it);
}

void ResidencyBudget::note(const Range& r, ResidencyEvent::Kind kind) {
  if (!timeline_) return;
  auto label = labels_.find(r.address);
  timeline_->record({std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch()).count(),
                     r.device, r.share, r.address, r.bytes, kind,
                     share_of(r.device, r.share).stats.resident_bytes,
                     devices_[r.device].stats.resident_bytes,
                     label == labels_.end() ? std::string() : label->second});
}

void ResidencyBudget::label(std::uintptr_t address, std::string name) {
  std::lock_guard<std::mutex> lock(mutex_);
  labels_[address] = std::move(name);
}

void ResidencyBudget::unlabel(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  labels_.erase(address);
}

void ResidencyBudget::start_timeline(std::size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeline_ = std::make_unique<ResidencyTimeline>(capacity);
}

std::vector<ResidencyEvent> ResidencyBudget::take_timeline(std::size_t* dropped) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ResidencyEvent> out;
  if (dropped) *dropped = 0;
  if (!timeline_) return out;
  out.assign(timeline_->events().begin(), timeline_->events().end());
  if (dropped) *dropped = timeline_->dropped();
  timeline_.reset();
  return out;
}

std::array<ResidencyStats*, 2> ResidencyBudget::figures_of(const Range& r) {
  return {&share_of(r.device, r.share).stats, &devices_[r.device].stats};
}

void ResidencyBudget::count_eviction(const Range& r, Eviction how) {
  const int i = static_cast<int>(how);
  for (ResidencyStats* st : figures_of(r)) {
    ++st->evictions[i];
    st->evicted_bytes[i] += r.bytes;
  }
}

std::vector<EvictionStep> ResidencyBudget::admit(DeviceIndex device, std::uintptr_t address,
                                                 std::size_t bytes, bool written,
                                                 ShareId share, bool arrives) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(device >= 0, "a residency budget is for a GPU, got device ", device);
  Share& s = share_of(device, share);
  if (auto it = where_.find(address); it != where_.end()) {
    Range range = *it->second;
    if (range.device == device && range.share == share && range.bytes == bytes) {
      range.written = range.written || written;  // resident: most recently used
      s.lru.erase(it->second);
      it->second = s.lru.insert(s.lru.end(), range);
      return {};
    }
    erase(it->second, ResidencyEvent::kForget);  // elsewhere, or another size: admitted anew
  }
  std::vector<EvictionStep> steps;
  const auto budget = budget_of(s);
  if (budget) {
    const char* whose = share == kDeviceShare ? "residency limit's room for batches"
                                              : "residency budget";
    TORCH_UVM_CHECK_ARG(bytes <= *budget, "a range of ", bytes, " bytes cannot fit the ", whose,
                        " of ", *budget, " bytes on cuda:", device);
    std::size_t evictable = 0;
    for (const Range& r : s.lru) evictable += r.busy ? 0 : r.bytes;
    TORCH_UVM_CHECK_ARG(s.stats.resident_bytes - evictable + bytes <= *budget, "bringing ",
                        bytes, " bytes to cuda:", device, " would exceed the ", whose, " of ",
                        *budget, " bytes even after evicting every range not in use (",
                        s.stats.resident_bytes - evictable, " bytes are in use)");
    evict_for(s, bytes, *budget, steps);
  }
  where_[address] = s.lru.insert(s.lru.end(), Range{device, share, address, bytes, written, false});
  PerDevice& d = per_device(device);
  // A range that arrives is drawn only once the copies home under way leave
  // it room (the caller waits while excess() says so): what it waits for is
  // not held beside it. Memory made on the GPU (adopted) is there already.
  // Memory made on the GPU is held beside the written ranges it evicts
  // until their copies home pass (the caller reports them leaving next).
  std::size_t waits = 0, beside = 0;
  if (arrives) {
    const std::size_t over = held(s) + bytes;
    if (budget && over > *budget) waits = std::min(s.stats.leaving_bytes, over - *budget);
  } else {
    for (const EvictionStep& e : steps) beside += e.how == Eviction::kWriteHome ? e.bytes : 0;
  }
  for (ResidencyStats* st : {&s.stats, &d.stats}) {
    st->resident_bytes += bytes;
    if (arrives) st->prefetched_bytes += bytes;
    st->peak_resident_bytes = std::max(
        st->peak_resident_bytes, st->resident_bytes + st->leaving_bytes + beside - waits);
  }
  note(*where_[address], arrives ? ResidencyEvent::kArrive : ResidencyEvent::kAdopt);
  return steps;
}

void ResidencyBudget::evict_for(Share& s, std::size_t bytes, std::size_t budget,
                                std::vector<EvictionStep>& steps) {
  for (auto it = s.lru.begin();
       it != s.lru.end() && held(s) + bytes > budget;) {
    if (it->busy) {
      ++it;
      continue;
    }
    auto next = std::next(it);
    steps.push_back(evict_range(it));
    it = next;
  }
}

EvictionStep ResidencyBudget::evict_range(Lru::iterator it) {
  const Eviction how = it->written ? Eviction::kWriteHome : Eviction::kDrop;
  const EvictionStep step{it->address, it->bytes, how};
  count_eviction(*it, how);
  erase(it, left_by(how));
  return step;
}

std::vector<EvictionStep> ResidencyBudget::make_room(DeviceIndex device, ShareId share,
                                                     std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Share& s = share_of(device, share);
  std::vector<EvictionStep> steps;
  if (const auto budget = budget_of(s)) evict_for(s, bytes, *budget, steps);
  return steps;
}

std::optional<EvictionStep> ResidencyBudget::evict_least_recent(
    DeviceIndex device, ShareId share, const std::function<bool(std::uintptr_t)>& which) {
  std::lock_guard<std::mutex> lock(mutex_);
  Share& s = share_of(device, share);
  for (auto it = s.lru.begin(); it != s.lru.end(); ++it) {
    if (!it->busy && (!which || which(it->address))) return evict_range(it);
  }
  return std::nullopt;
}

void ResidencyBudget::withdraw(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(address);
  if (it == where_.end()) return;
  const Range& r = *it->second;
  for (ResidencyStats* st : figures_of(r)) {
    st->prefetched_bytes -= std::min(st->prefetched_bytes, r.bytes);
  }
  erase(it->second, ResidencyEvent::kForget);
}

void ResidencyBudget::leaving(DeviceIndex device, ShareId share, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Share& s = share_of(device, share);
  // (the peak is unchanged: these bytes were resident until now)
  for (ResidencyStats* st : {&s.stats, &per_device(device).stats}) st->leaving_bytes += bytes;
}

void ResidencyBudget::left(DeviceIndex device, ShareId share, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Share& s = share_of(device, share);
  TORCH_UVM_CHECK_ARG(bytes <= s.stats.leaving_bytes, "residency share ", share, ": ", bytes,
                  " bytes left, but only ", s.stats.leaving_bytes, " were leaving");
  for (ResidencyStats* st : {&s.stats, &per_device(device).stats}) st->leaving_bytes -= bytes;
}

std::size_t ResidencyBudget::excess(DeviceIndex device, ShareId share, std::size_t extra) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (share == kDeviceShare) {
    auto it = device_shares_.find(device);
    if (it == device_shares_.end()) return 0;  // nothing resident, nothing leaving
    return excess_of(it->second, extra);
  }
  return excess_of(open_share_of(device, share), extra);
}

std::size_t ResidencyBudget::excess_of(const Share& s, std::size_t extra) const {
  const auto budget = budget_of(s);
  const std::size_t over = held(s) + extra;
  if (!budget || over <= *budget) return 0;
  // ranges in use hold it over whatever passes: waiting would not help
  return over - *budget <= s.stats.leaving_bytes ? over - *budget : 0;
}

void ResidencyBudget::set_busy(std::uintptr_t address, bool busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = where_.find(address); it != where_.end()) it->second->busy = busy;
}

void ResidencyBudget::mark_written(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = where_.find(address); it != where_.end()) it->second->written = true;
}

void ResidencyBudget::mark_clean(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = where_.find(address); it != where_.end()) it->second->written = false;
}

void ResidencyBudget::forget(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = where_.find(address); it != where_.end()) erase(it->second, ResidencyEvent::kForget);
}

std::optional<Eviction> ResidencyBudget::evict(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(address);
  if (it == where_.end()) return std::nullopt;
  return evict_range(it->second).how;
}

void ResidencyBudget::discard(std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(address);
  if (it == where_.end()) return;
  const Range& r = *it->second;
  for (ResidencyStats* st : figures_of(r)) {
    ++st->discards;
    st->discarded_bytes += r.bytes;
  }
  erase(it->second, ResidencyEvent::kDiscard);
}

bool ResidencyBudget::is_resident(DeviceIndex device, std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(address);
  return it != where_.end() && it->second->device == device;
}

bool ResidencyBudget::is_busy(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(address);
  return it != where_.end() && it->second->busy;
}

ResidencyStats ResidencyBudget::stats(DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? ResidencyStats{} : it->second.stats;
}

ResidencyStats ResidencyBudget::share_stats(ShareId share) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shares_.find(share);
  return it == shares_.end() ? ResidencyStats{} : it->second.stats;
}

void ResidencyBudget::reset_peak(DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  ResidencyStats& s = per_device(device).stats;
  s.peak_resident_bytes = s.resident_bytes + s.leaving_bytes;
  for (ShareId id : per_device(device).shares) {
    ResidencyStats& t = shares_.at(id).stats;
    t.peak_resident_bytes = t.resident_bytes + t.leaving_bytes;
  }
}

}  // namespace torch_uvm
