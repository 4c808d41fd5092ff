#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "core/errors.h"

namespace torch_uvm {
namespace {

constexpr std::size_t kMiB = 1u << 20;

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\n");
  auto e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

double parse_number(const std::string& key, const std::string& value) {
  const char* begin = value.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(begin, &end);
  TORCH_UVM_CHECK_ARG(end != begin && *end == '\0' && errno == 0 &&
                          std::isfinite(v) && v >= 0,
                      "PYTORCH_UVM_ALLOC_CONF: option '", key,
                      "' needs a non-negative number, got '", value, "'");
  return v;
}

std::size_t parse_mb(const std::string& key, const std::string& value) {
  double v = parse_number(key, value);
  TORCH_UVM_CHECK_ARG(v * kMiB < 9.0e18, "PYTORCH_UVM_ALLOC_CONF: option '",
                      key, "' is too large: ", value, " MiB");
  return static_cast<std::size_t>(v * kMiB);
}

struct Option {
  const char* name;
  const char* default_text;
  const char* meaning;
  std::function<void(AllocatorConfig&, const std::string& key,
                     const std::string& value)>
      apply;
};

std::size_t positive_mb(const std::string& k, const std::string& v) {
  std::size_t bytes = parse_mb(k, v);
  TORCH_UVM_CHECK_ARG(bytes >= 4096, "PYTORCH_UVM_ALLOC_CONF: option '", k,
                      "' must be at least 4 KiB, got ", v, " MiB");
  return bytes;
}

const std::vector<Option>& options() {
  static const std::vector<Option> table = {
      {"max_split_size_mb", "unlimited",
       "blocks at least this large are never split (limits fragmentation)",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.max_split_size = positive_mb(k, v);
       }},
      {"roundup_power2_divisions", "0",
       "round requests up to one of N steps between powers of two (0: off)",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         double n = parse_number(k, v);
         TORCH_UVM_CHECK_ARG(
             n == std::floor(n) && n <= 64 &&
                 (n == 0 || (static_cast<unsigned>(n) &
                             (static_cast<unsigned>(n) - 1)) == 0),
             "PYTORCH_UVM_ALLOC_CONF: roundup_power2_divisions must be 0 or "
             "a power of two up to 64, got ", v);
         c.roundup_power2_divisions = static_cast<std::size_t>(n);
       }},
      {"release_threshold_mb", "0",
       "bytes of free segments that empty_cache() keeps cached",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.release_threshold = parse_mb(k, v);
       }},
      {"small_segment_mb", "2", "segment size of the small pool (<= 1 MiB requests)",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.small_segment_size = positive_mb(k, v);
         TORCH_UVM_CHECK_ARG(c.small_segment_size >= c.small_size,
                             "PYTORCH_UVM_ALLOC_CONF: small_segment_mb must be "
                             "at least 1 (the largest small request)");
       }},
      {"large_segment_mb", "20",
       "shared segment size for large requests under 10 MiB",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.large_segment_size = positive_mb(k, v);
         TORCH_UVM_CHECK_ARG(
             c.large_segment_size >= c.large_segment_threshold,
             "PYTORCH_UVM_ALLOC_CONF: large_segment_mb must be at least 10");
       }},
      {"cap_fraction", "0.8",
       "default cap on managed bytes, as a fraction of free device memory at "
       "start",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         double f = parse_number(k, v);
         TORCH_UVM_CHECK_ARG(f > 0 && f <= 1.0,
                             "PYTORCH_UVM_ALLOC_CONF: cap_fraction must be in "
                             "(0, 1], got ", v);
         c.cap_fraction = f;
       }},
      {"cap_mb", "from cap_fraction",
       "cap on managed bytes, in MiB; above free device memory only with "
       "allow_oversubscription",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.cap_bytes = positive_mb(k, v);
       }},
      {"allow_oversubscription", "false",
       "let the cap exceed free device memory (can stall the GPU)",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.allow_oversubscription =
             parse_bool(v, "PYTORCH_UVM_ALLOC_CONF option '" + k + "'");
       }},
      {"advise_segments", "true",
       "set preferred location / accessed-by once per new segment",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.advise_segments =
             parse_bool(v, "PYTORCH_UVM_ALLOC_CONF option '" + k + "'");
       }},
      {"async_prefetch", "true",
       "issue the prefetch of a move to a GPU from a worker thread; the GPU's "
       "stream waits for it, the caller does not",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.async_prefetch = parse_bool(v, "PYTORCH_UVM_ALLOC_CONF option '" + k + "'");
       }},
      {"residency_limit_mb", "none",
       "residency budget per GPU for the memory torch_uvm streams (offload, "
       "prefetching), in MiB",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.residency_limit = positive_mb(k, v);
       }},
      {"prefetch_on_alloc", "false",
       "prefetch each new allocation to its GPU on its stream (RMM's prefetch "
       "adaptor)",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.prefetch_on_alloc = parse_bool(v, "PYTORCH_UVM_ALLOC_CONF option '" + k + "'");
       }},
      {"driver_counters", "true",
       "enable the driver's unified-memory counters (CUPTI) once when the allocator "
       "starts, so that torch_uvm.profile() can count every managed allocation "
       "(~0.1-0.2 s, once)",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.driver_counters = parse_bool(v, "PYTORCH_UVM_ALLOC_CONF option '" + k + "'");
       }},
      {"prefetch_chunk_mb", "0",
       "the worker prefetches in pieces of this size (0: whole ranges)",
       [](AllocatorConfig& c, const std::string& k, const std::string& v) {
         c.prefetch_chunk = parse_mb(k, v);
       }},
  };
  return table;
}

struct Variable {
  const char* name;
  const char* default_text;
  const char* meaning;
  std::function<void(OffloadEnvironment&, const std::string& value)> apply;
};

const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = {
      {"TORCH_UVM_HOST_STEP_THREADS",
       "the intra-op threads but two; a rank's (fsdp.step_in_backward): its share of the cores "
       "but two",
       "the threads a host step runs on (stream_optimizer's host_step, fsdp.step_in_backward)",
       [](OffloadEnvironment& e, const std::string& v) {
         char* end = nullptr;
         errno = 0;
         const long n = std::strtol(v.c_str(), &end, 10);
         TORCH_UVM_CHECK_ARG(end != v.c_str() && *end == '\0' && errno == 0 && n >= 1 &&
                                 n <= 1 << 16,
                             "torch_uvm: TORCH_UVM_HOST_STEP_THREADS is the number of threads a "
                             "host step runs on, a whole number of at least 1; got '", v, "'");
         e.host_step_threads = static_cast<int>(n);
       }},
      {"TORCH_UVM_HOST_STEP_COPIES", "0.125",
       "the share of the budget that gradients copying home in backward may take before "
       "the backward waits for the oldest (host_step)",
       [](OffloadEnvironment& e, const std::string& v) {
         char* end = nullptr;
         errno = 0;
         const double share = std::strtod(v.c_str(), &end);
         TORCH_UVM_CHECK_ARG(end != v.c_str() && *end == '\0' && errno == 0 &&
                                 std::isfinite(share) && share >= 0 && share <= 1,
                             "torch_uvm: TORCH_UVM_HOST_STEP_COPIES is the share of the budget "
                             "that gradients copying home in backward may take before it waits, "
                             "a number from 0 (one submodule's at a time) to 1; got '", v, "'");
         e.host_step_copies = share;
       }},
      {"TORCH_UVM_QUIET", "0",
       "1 hides the progress shown while an offload pins its homes and reads a checkpoint",
       [](OffloadEnvironment& e, const std::string& v) {
         e.quiet = parse_bool(v, "TORCH_UVM_QUIET");
       }},
  };
  return table;
}

std::string option_names() {
  std::string names;
  for (const auto& o : options()) {
    names += names.empty() ? "" : ", ";
    names += o.name;
  }
  return names;
}

}  // namespace

bool parse_bool(const std::string& value, const std::string& what) {
  std::string v = trim(value);
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw InvalidArgument(what + ": expected 1/0, true/false, yes/no or on/off, got '" +
                        value + "'");
}

AllocatorConfig parse_config(const std::string& text, AllocatorConfig base) {
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) continue;
    std::size_t colon = item.find(':');
    TORCH_UVM_CHECK_ARG(colon != std::string::npos,
                        "PYTORCH_UVM_ALLOC_CONF: expected 'key:value', got '",
                        item, "'. Valid keys: ", option_names());
    std::string key = trim(item.substr(0, colon));
    std::string value = trim(item.substr(colon + 1));
    auto it = std::find_if(options().begin(), options().end(),
                           [&](const Option& o) { return key == o.name; });
    TORCH_UVM_CHECK_ARG(it != options().end(),
                        "PYTORCH_UVM_ALLOC_CONF: unknown option '", key,
                        "'. Valid keys: ", option_names());
    it->apply(base, key, value);
  }
  return base;
}

AllocatorConfig config_from_environment() {
  const char* text = std::getenv("PYTORCH_UVM_ALLOC_CONF");
  return text ? parse_config(text) : AllocatorConfig{};
}

void parse_offload_variable(const std::string& variable, const std::string& value,
                            OffloadEnvironment& env) {
  auto it = std::find_if(variables().begin(), variables().end(),
                         [&](const Variable& v) { return variable == v.name; });
  TORCH_UVM_CHECK_ARG(it != variables().end(), "torch_uvm: no offload setting is read from '",
                      variable, "'");
  const std::string v = trim(value);
  if (!v.empty()) it->apply(env, v);
}

OffloadEnvironment offload_environment() {
  OffloadEnvironment env;
  for (const auto& v : variables()) {
    const char* text = std::getenv(v.name);
    if (text) parse_offload_variable(v.name, text, env);
  }
  return env;
}

std::vector<std::string> describe_offload_variables() {
  std::vector<std::string> lines;
  for (const auto& v : variables()) {
    lines.push_back(std::string(v.name) + " (default " + v.default_text + "): " + v.meaning);
  }
  return lines;
}

std::vector<std::string> describe_options() {
  std::vector<std::string> lines;
  for (const auto& o : options()) {
    lines.push_back(std::string(o.name) + " (default " + o.default_text +
                    "): " + o.meaning);
  }
  return lines;
}

}  // namespace torch_uvm
