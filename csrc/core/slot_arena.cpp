#include "core/slot_arena.h"

#include <algorithm>

#include "core/block_split.h"
#include "core/errors.h"
#include "core/size_policy.h"

namespace torch_uvm {

SlotArena::SlotArena(Runtime& runtime, void* base, std::size_t capacity, StreamRef stream)
    : pending_(runtime) {
  TORCH_UVM_CHECK_ARG(capacity >= kMinBlockSize, "a slot arena of ", capacity,
                      " bytes is smaller than one block (", kMinBlockSize, " bytes)");
  segment_.base = static_cast<char*>(base);
  segment_.size = capacity / kMinBlockSize * kMinBlockSize;
  segment_.home = stream.device;
  segment_.stream = stream;
  auto* whole = new Block();
  whole->ptr = segment_.base;
  whole->size = segment_.size;
  whole->segment = &segment_;
  segment_.head = whole;
  cursor_ = segment_.base;
}

std::size_t SlotArena::block_bytes(std::size_t bytes) {
  return std::max(kMinBlockSize, (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize);
}

SlotArena::~SlotArena() {
  for (Block* b = segment_.head; b != nullptr;) {
    Block* next = b->next;
    delete b;
    b = next;
  }
}

Block* SlotArena::fit(std::size_t size) {
  Block* start = segment_.head;  // the block holding the cursor
  while (start->next != nullptr && start->ptr + start->size <= cursor_) start = start->next;
  Block* b = start;
  do {
    if (b->state == BlockState::kFree && b->size >= size) return b;
    b = b->next != nullptr ? b->next : segment_.head;
  } while (b != start);
  return nullptr;
}

Block* SlotArena::place(std::size_t size) {
  Block* block = fit(size);
  if (block == nullptr) return nullptr;
  if (block->size - size >= kMinBlockSize) split_block(block, size);
  cursor_ = block->ptr + block->size;
  block->state = BlockState::kAllocated;
  return block;
}

std::vector<void*> SlotArena::place_all(const std::vector<std::size_t>& bytes) {
  char* const cursor = cursor_;
  std::vector<Block*> placed;
  for (std::size_t b : bytes) {
    Block* block = place(block_bytes(b));
    if (block == nullptr) break;
    block->requested = b;
    placed.push_back(block);
  }
  std::vector<void*> out;
  if (placed.size() < bytes.size()) {  // taken back in reverse: they coalesce as they were
    for (auto it = placed.rbegin(); it != placed.rend(); ++it) return_to_pool(*it);
    cursor_ = cursor;
    return out;
  }
  for (Block* block : placed) {
    allocated_[block->ptr] = block;
    stats_.allocated += block->size;
    out.push_back(block->ptr);
  }
  stats_.allocated_peak = std::max(stats_.allocated_peak, stats_.allocated);
  return out;
}

std::vector<void*> SlotArena::allocate_all(const std::vector<std::size_t>& bytes, bool wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Block* b : pending_.take_completed()) return_to_pool(b);
  std::vector<void*> out = place_all(bytes);
  if (wait && out.empty() && !bytes.empty() && !pending_.empty()) {
    ++stats_.waits;  // (under the lock: the frees that wait for it are this arena's)
    wait_pending();
    out = place_all(bytes);
  }
  return out;
}

void* SlotArena::allocate(std::size_t bytes) {
  const std::vector<void*> one = allocate_all({bytes});
  return one.empty() ? nullptr : one.front();
}

void SlotArena::wait_pending() {
  auto events = pending_.detach();
  std::vector<bool> done;
  pending_.wait(events, done);  // a failed wait leaves its block parked
  for (Block* b : pending_.settle(events, done)) return_to_pool(b);
}

void SlotArena::record_stream(void* ptr, StreamRef stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(ptr);
  TORCH_UVM_CHECK_ARG(it != allocated_.end(), "record_stream: no slot at ", ptr,
                      " in this arena");
  auto& uses = it->second->stream_uses;
  if (stream != segment_.stream && std::find(uses.begin(), uses.end(), stream) == uses.end()) {
    uses.push_back(stream);
  }
}

void SlotArena::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(ptr);
  TORCH_UVM_CHECK_ARG(it != allocated_.end(), "free: no slot at ", ptr, " in this arena");
  Block* block = it->second;
  allocated_.erase(it);
  stats_.allocated -= block->size;
  block->requested = 0;
  if (block->stream_uses.empty() || pending_.defer(block)) return_to_pool(block);
}

void SlotArena::return_to_pool(Block* block) {
  block->state = BlockState::kFree;
  block->stream_uses.clear();
  coalesce_block(block);
}

SlotArena::Stats SlotArena::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace torch_uvm
