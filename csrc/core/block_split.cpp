#include "core/block_split.h"

namespace torch_uvm {

Block* split_block(Block* block, std::size_t size) {
  Block* tail = new Block();
  tail->ptr = block->ptr + size;
  tail->size = block->size - size;
  tail->segment = block->segment;
  tail->state = BlockState::kFree;
  tail->prev = block;
  tail->next = block->next;
  if (tail->next) tail->next->prev = tail;
  block->next = tail;
  block->size = size;
  return tail;
}

Block* coalesce_block(Block* block) {
  if (Block* prev = block->prev; prev && prev->state == BlockState::kFree) {
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    if (block->segment->head == block) block->segment->head = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next && next->state == BlockState::kFree) {
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    delete next;
  }
  return block;
}

}  // namespace torch_uvm
