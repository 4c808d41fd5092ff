#include "core/block_pool.h"

#include <tuple>

namespace torch_uvm {

bool BlockOrder::operator()(const Block* a, const Block* b) const {
  const Segment& sa = *a->segment;
  const Segment& sb = *b->segment;
  return std::tie(sa.pool, sa.home, sa.stream, a->size, a->ptr) <
         std::tie(sb.pool, sb.home, sb.stream, b->size, b->ptr);
}

Block* BlockPool::best_fit(PoolId pool, DeviceIndex home, StreamRef stream,
                           std::size_t size) const {
  Segment key_segment;
  key_segment.pool = pool;
  key_segment.home = home;
  key_segment.stream = stream;
  Block key;
  key.segment = &key_segment;
  key.size = size;
  key.ptr = nullptr;
  auto it = blocks_.lower_bound(&key);
  if (it == blocks_.end()) return nullptr;
  const Segment& found = *(*it)->segment;
  if (found.pool != pool || found.home != home || found.stream != stream) return nullptr;
  return *it;
}

}  // namespace torch_uvm
