#include "core/stats.h"

namespace torch_uvm {
namespace {

template <typename F>
void for_each_array(MemoryStats& s, F f) {
  for (StatArray* a :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split,
        &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
        &s.inactive_split_bytes, &s.requested_bytes, &s.oversize_allocations,
        &s.oversize_segments}) {
    for (Stat& stat : a->pools) f(stat);
  }
}

}  // namespace

void MemoryStats::reset_peak() {
  for_each_array(*this, [](Stat& s) { s.reset_peak(); });
}

void MemoryStats::reset_accumulated() {
  for_each_array(*this, [](Stat& s) { s.reset_accumulated(); });
  num_alloc_retries = num_ooms = num_sync_all_streams = 0;
  num_device_alloc = num_device_free = 0;
}

void StatsBook::reset_peak() {
  total_.reset_peak();
  for (MemoryStats& s : homes_) s.reset_peak();
}

void StatsBook::reset_peak(DeviceIndex home) { homes_.at(slot(home)).reset_peak(); }

void StatsBook::reset_accumulated() {
  total_.reset_accumulated();
  for (MemoryStats& s : homes_) s.reset_accumulated();
}

void StatsBook::reset_accumulated(DeviceIndex home) {
  homes_.at(slot(home)).reset_accumulated();
}

std::vector<std::pair<std::string, int64_t>> flatten(const MemoryStats& s) {
  std::vector<std::pair<std::string, int64_t>> out;
  const std::pair<const char*, const StatArray*> arrays[] = {
      {"allocation", &s.allocation},
      {"segment", &s.segment},
      {"active", &s.active},
      {"inactive_split", &s.inactive_split},
      {"allocated_bytes", &s.allocated_bytes},
      {"reserved_bytes", &s.reserved_bytes},
      {"active_bytes", &s.active_bytes},
      {"inactive_split_bytes", &s.inactive_split_bytes},
      {"requested_bytes", &s.requested_bytes},
  };
  const char* pools[] = {"all", "small_pool", "large_pool"};
  for (const auto& [name, array] : arrays) {
    for (int p = 0; p < kNumStatPools; ++p) {
      const Stat& stat = array->pools[p];
      std::string prefix = std::string(name) + "." + pools[p] + ".";
      out.emplace_back(prefix + "current", stat.current);
      out.emplace_back(prefix + "peak", stat.peak);
      out.emplace_back(prefix + "allocated", stat.allocated);
      out.emplace_back(prefix + "freed", stat.freed);
    }
  }
  for (const auto& [name, array] :
       {std::pair<const char*, const StatArray*>{"oversize_allocations",
                                                 &s.oversize_allocations},
        {"oversize_segments", &s.oversize_segments}}) {
    const Stat& stat = array->all();
    std::string prefix = std::string(name) + ".";
    out.emplace_back(prefix + "current", stat.current);
    out.emplace_back(prefix + "peak", stat.peak);
    out.emplace_back(prefix + "allocated", stat.allocated);
    out.emplace_back(prefix + "freed", stat.freed);
  }
  out.emplace_back("num_alloc_retries", s.num_alloc_retries);
  out.emplace_back("num_ooms", s.num_ooms);
  out.emplace_back("num_sync_all_streams", s.num_sync_all_streams);
  out.emplace_back("num_device_alloc", s.num_device_alloc);
  out.emplace_back("num_device_free", s.num_device_free);
  out.emplace_back("max_split_size", s.max_split_size);
  out.emplace_back("cap_bytes", s.cap_bytes);
  return out;
}

}  // namespace torch_uvm
