#include <cstdint>
#include <cstdio>

#include "core/errors.h"
#include "core/types.h"

namespace torch_uvm {

std::string device_name(DeviceIndex device) {
  return device == kCpuDevice ? std::string("cpu")
                              : "cuda:" + std::to_string(device);
}

std::string advice_name(Advice advice) {
  switch (advice) {
    case Advice::kSetReadMostly: return "set_read_mostly";
    case Advice::kUnsetReadMostly: return "unset_read_mostly";
    case Advice::kSetPreferredLocation: return "set_preferred_location";
    case Advice::kUnsetPreferredLocation: return "unset_preferred_location";
    case Advice::kSetAccessedBy: return "set_accessed_by";
    case Advice::kUnsetAccessedBy: return "unset_accessed_by";
  }
  return "unknown";
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

std::string format_bytes(std::size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  }
  return buf;
}

}  // namespace torch_uvm
