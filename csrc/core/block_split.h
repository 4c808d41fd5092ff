// Where blocks are split and coalesced. Both keep the invariant of block.h:
// the blocks of a segment tile it, and no two neighbours are both free.
#pragma once

#include <cstddef>

#include "core/block.h"

namespace torch_uvm {

// Cuts `block` to `size` bytes and returns the new free block made of the tail.
// The caller puts the tail into its pool.
Block* split_block(Block* block, std::size_t size);

// Merges `block` (now free) with its free neighbours, which the caller has
// already removed from its pool. Returns the merged block; the absorbed
// neighbours are deleted.
Block* coalesce_block(Block* block);

}  // namespace torch_uvm
