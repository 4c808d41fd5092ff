// Names for ranges of memory, so that what the driver reports by address
// (core/um_event.h) can be told per tensor, submodule or allocation: the
// first name given to a byte keeps it (a user's tensor before the submodule
// it belongs to, before the allocation that holds it). Lookups split a range
// across the names it covers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace torch_uvm {

class AddressNames {
 public:
  // Names the bytes [address, address + bytes) that no earlier call named.
  void add(std::uintptr_t address, std::size_t bytes, const std::string& name);

  // The name of the byte at `address`, or "" if none.
  std::string name_at(std::uintptr_t address) const;

  // Calls `piece(name, bytes)` for each part of [address, address + bytes),
  // in address order; unnamed parts get "".
  void split(std::uintptr_t address, std::size_t bytes,
             const std::function<void(const std::string&, std::size_t)>& piece) const;

  std::size_t ranges() const { return ranges_.size(); }

 private:
  struct Range {
    std::uintptr_t end;
    std::string name;
  };
  std::map<std::uintptr_t, Range> ranges_;   // disjoint, by start
};

}  // namespace torch_uvm
