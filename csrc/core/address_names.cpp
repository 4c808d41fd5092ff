#include "core/address_names.h"

#include <algorithm>
#include <limits>

#include "core/um_event.h"

namespace torch_uvm {
namespace {
// The end of [address, address + bytes), saturated at the top of the address space.
std::uintptr_t end_of(std::uintptr_t address, std::size_t bytes) {
  const std::uintptr_t top = std::numeric_limits<std::uintptr_t>::max();
  return bytes > top - address ? top : address + bytes;
}
}  // namespace

void AddressNames::add(std::uintptr_t address, std::size_t bytes, const std::string& name) {
  std::uintptr_t at = address;
  const std::uintptr_t end = end_of(address, bytes);
  // The first range that ends after `at`: the one before it may cover `at`.
  auto it = ranges_.upper_bound(at);
  if (it != ranges_.begin() && std::prev(it)->second.end > at) --it;
  while (at < end) {
    if (it == ranges_.end() || it->first >= end) {   // a gap to the end
      ranges_.emplace_hint(it, at, Range{end, name});
      return;
    }
    if (it->first > at) ranges_.emplace_hint(it, at, Range{it->first, name});  // the gap before
    at = std::max(at, it->second.end);
    ++it;
  }
}

std::string AddressNames::name_at(std::uintptr_t address) const {
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return "";
  --it;
  return address < it->second.end ? it->second.name : "";
}

void AddressNames::split(std::uintptr_t address, std::size_t bytes,
                         const std::function<void(const std::string&, std::size_t)>& piece) const {
  std::uintptr_t at = address;
  const std::uintptr_t end = end_of(address, bytes);
  auto it = ranges_.upper_bound(at);
  if (it != ranges_.begin() && std::prev(it)->second.end > at) --it;
  static const std::string unnamed;
  while (at < end) {
    if (it == ranges_.end() || it->first >= end) {
      piece(unnamed, end - at);
      return;
    }
    if (it->first > at) {
      piece(unnamed, it->first - at);
      at = it->first;
    }
    const std::uintptr_t stop = std::min(end, it->second.end);
    piece(it->second.name, stop - at);
    at = stop;
    ++it;
  }
}

}  // namespace torch_uvm
