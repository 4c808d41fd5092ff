// The allocator's error types. Every message names what was asked, what was
// wrong and what to do. The torch glue translates these into c10::Error /
// torch.OutOfMemoryError; C++ users can catch them directly.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace torch_uvm {

// A request the caller can fix: bad size, unknown pointer, bad option.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The cap or the device is exhausted even after the cache was released.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Calls in an order the engine cannot follow (a second backward before the
// optimizer's step, with step_in_backward): the caller changes its loop.
class OrderError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A driver call failed. The message names the call and the driver's error.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

std::string format_bytes(std::size_t bytes);  // "1.50 GiB"
std::string hex(const void* p);               // "0x7f3a00000000"

}  // namespace torch_uvm

#define TORCH_UVM_CHECK_ARG(cond, ...)                                 \
  do {                                                                 \
    if (!(cond)) {                                                     \
      throw ::torch_uvm::InvalidArgument(                              \
          ::torch_uvm::detail::concat(__VA_ARGS__));                   \
    }                                                                  \
  } while (0)
