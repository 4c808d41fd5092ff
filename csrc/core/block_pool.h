// Cached free blocks, searchable by best fit. Blocks are ordered by (pool,
// home, stream, size, address): the smallest block of the right pool, home and
// stream that is at least the request is one lower_bound away, so a cache hit
// is O(log n).
#pragma once

#include <cstddef>
#include <set>

#include "core/block.h"

namespace torch_uvm {

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const;
};

class BlockPool {
 public:
  void insert(Block* block) { blocks_.insert(block); }
  void erase(Block* block) { blocks_.erase(block); }

  // The smallest cached block of this pool, home and stream with size >=
  // `size`, or nullptr.
  Block* best_fit(PoolId pool, DeviceIndex home, StreamRef stream, std::size_t size) const;

  std::size_t count() const { return blocks_.size(); }
  const std::set<Block*, BlockOrder>& blocks() const { return blocks_; }

 private:
  std::set<Block*, BlockOrder> blocks_;
};

}  // namespace torch_uvm
