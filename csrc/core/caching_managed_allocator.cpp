#include "core/caching_managed_allocator.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "core/block_split.h"
#include "core/errors.h"

namespace torch_uvm {

CachingManagedAllocator::CachingManagedAllocator(std::shared_ptr<Runtime> runtime,
                                                 AllocatorConfig config)
    : runtime_(std::move(runtime)),
      policy_(config),
      cap_(*runtime_, config),
      release_threshold_(config.release_threshold),
      device_count_(runtime_->device_count()),
      pending_(*runtime_),
      stats_(device_count_) {
  stats_.set(&MemoryStats::max_split_size,
             config.max_split_size == SIZE_MAX ? 0 : static_cast<int64_t>(config.max_split_size));
  // The cap is known once a GPU is first used (memory_cap.h).
  stats_.set(&MemoryStats::cap_bytes, static_cast<int64_t>(config.cap_bytes));
}

CachingManagedAllocator::~CachingManagedAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    auto events = pending_.detach();
    std::vector<bool> done;
    pending_.wait(events, done);
    for (const auto& e : events) runtime_->destroy_event(e.event);
  } catch (...) {
    // The runtime may be shutting down; the memory goes with the process.
  }
  for (auto& [base, segment] : segments_) {
    try {
      runtime_->free_managed(segment->base);
    } catch (...) {
    }
    for (Block* b = segment->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    delete segment;
  }
}

// ---- allocation ------------------------------------------------------------

void* CachingManagedAllocator::allocate(std::size_t bytes, DeviceIndex home,
                                        StreamRef stream) {
  if (bytes == 0) return nullptr;
  TORCH_UVM_CHECK_ARG(home == kCpuDevice || (home >= 0 && home < device_count_),
                      "cannot allocate managed memory for device ", home,
                      ": valid devices are cpu (-1) and 0..",
                      device_count_ - 1, " (", device_count_,
                      " GPU(s) present)");
  std::size_t size = policy_.round_request(bytes);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!pending_.empty() && captures_underway_ == 0) drain_pending();
  const Placement where{home, stream, pool_for(stream)};
  Block* block = allocate_block(size, bytes, where, lock);
  hand_out(block, bytes);
  return block->ptr;
}

void CachingManagedAllocator::hand_out(Block* block, std::size_t requested) {
  const Segment& seg = *block->segment;
  const auto bytes = static_cast<int64_t>(block->size);
  block->state = BlockState::kAllocated;
  block->requested = requested;
  ++block->segment->allocated_blocks;
  live_blocks_.emplace(block->ptr, block);
  stats_.increase(&MemoryStats::allocation, seg.home, seg.small, 1);
  stats_.increase(&MemoryStats::allocated_bytes, seg.home, seg.small, bytes);
  stats_.increase(&MemoryStats::active, seg.home, seg.small, 1);
  stats_.increase(&MemoryStats::active_bytes, seg.home, seg.small, bytes);
  stats_.increase(&MemoryStats::requested_bytes, seg.home, seg.small,
                  static_cast<int64_t>(requested));
  if (block->size >= policy_.config().max_split_size) {
    stats_.increase(&MemoryStats::oversize_allocations, seg.home, seg.small, 1);
  }
  if (observer_) notify(AllocatorEvent::kAlloc, block, requested);
}

Block* CachingManagedAllocator::allocate_block(std::size_t size,
                                               std::size_t requested,
                                               const Placement& where,
                                               std::unique_lock<std::mutex>& lock) {
  const bool small = policy_.is_small(size);
  if (Block* b = take_cached_block(size, where, small)) return b;
  if (Block* b = new_segment(size, where, small)) return b;
  if (captures_underway_ > 0) {
    throw_oom(requested, size, where,
              "a CUDA graph is being captured, so the cache cannot be released "
              "to make room");
  }
  // Slow path: give cached memory back to the runtime and try once more.
  // (Both steps wait without the lock; a failure to free leaves the segment
  // cached, and the retry below reports an OOM if there is still no room.)
  stats_.count(&MemoryStats::num_alloc_retries, where.home);
  drain_pending_waiting(lock);
  if (Block* b = take_cached_block(size, where, small)) return b;
  // A capture may have begun while the lock was released: then nothing is
  // freed (a free would break it).
  if (captures_underway_ == 0) release_cached(/*keep=*/0, lock);
  if (Block* b = take_cached_block(size, where, small)) return b;
  if (Block* b = new_segment(size, where, small)) return b;
  // Another thread may be freeing segments or waiting on events right now,
  // with their bytes still counted: wait for it to settle, then try again.
  if (in_flight_ > 0) {
    settled_.wait(lock, [this] { return in_flight_ == 0; });
    if (Block* b = take_cached_block(size, where, small)) return b;
    if (captures_underway_ == 0) release_cached(/*keep=*/0, lock);
    if (Block* b = take_cached_block(size, where, small)) return b;
    if (Block* b = new_segment(size, where, small)) return b;
  }
  std::size_t segment = policy_.segment_size(size);
  const char* why = "the device has no managed memory left";
  if (!cap_.admits(static_cast<std::size_t>(stats_.total().reserved_bytes.all().current) + outside_,
                   segment)) {
    why = "the request would exceed the managed memory cap";
  } else if (!cap_.admits_on(where.home, reserved_on(where.home), segment)) {
    why = "the request would exceed the device's memory fraction "
          "(torch.cuda.set_per_process_memory_fraction)";
  }
  throw_oom(requested, size, where, why);
}

Block* CachingManagedAllocator::take_cached_block(std::size_t size, const Placement& where,
                                                  bool small) {
  BlockPool& pool = small ? small_pool_ : large_pool_;
  Block* block = pool.best_fit(where.pool, where.home, where.stream, size);
  if (block == nullptr || !policy_.may_serve(block->size, size)) return nullptr;
  pool_erase(block);
  if (policy_.should_split(block->size, size)) {
    pool_insert(split_block(block, size));
  }
  return block;
}

Block* CachingManagedAllocator::new_segment(std::size_t size, const Placement& where,
                                            bool small) {
  std::size_t bytes = policy_.segment_size(size);
  cap_.use_device(where.home == kCpuDevice ? runtime_->current_device() : where.home);
  stats_.set(&MemoryStats::cap_bytes, static_cast<int64_t>(cap_.cap()));
  if (!cap_.admits(static_cast<std::size_t>(stats_.total().reserved_bytes.all().current) + outside_,
                   bytes) ||
      !cap_.admits_on(where.home, reserved_on(where.home), bytes)) {
    return nullptr;
  }
  void* base = runtime_->allocate_managed(bytes);
  if (base == nullptr) return nullptr;

  auto* segment = new Segment();
  segment->base = static_cast<char*>(base);
  segment->size = bytes;
  segment->home = where.home;
  segment->stream = where.stream;
  segment->pool = where.pool;
  segment->small = small;
  try {
    advise_new_segment(*segment);
  } catch (const std::exception& e) {
    // Advice is a hint: the segment works without it (pages then migrate on
    // fault). Keep it, and let the caller report the failure.
    if (hint_error_.empty()) hint_error_ = e.what();
    has_hint_error_.store(true, std::memory_order_release);
  }
  auto* block = new Block();
  block->ptr = segment->base;
  block->size = bytes;
  block->segment = segment;
  segment->head = block;
  segments_.emplace(segment->base, segment);
  if (segment->pool != kDefaultPool) ++pools_[segment->pool].segments;

  stats_.count(&MemoryStats::num_device_alloc, where.home);
  stats_.increase(&MemoryStats::segment, where.home, small, 1);
  stats_.increase(&MemoryStats::reserved_bytes, where.home, small, static_cast<int64_t>(bytes));
  if (bytes >= policy_.config().max_split_size) {
    stats_.increase(&MemoryStats::oversize_segments, where.home, small, 1);
  }
  if (observer_) notify(AllocatorEvent::kSegmentAlloc, block, bytes);
  if (policy_.should_split(block->size, size)) {
    pool_insert(split_block(block, size));
  }
  return block;
}

void CachingManagedAllocator::advise_new_segment(const Segment& segment) {
  // Advice on a fresh, unpopulated range is cheap; on populated memory it
  // costs ~16 ms per GiB. So the home's advice is set here, once per segment,
  // and never again on the hot path.
  if (!policy_.config().advise_segments || device_count_ == 0) return;
  if (segment.home == kCpuDevice) {
    runtime_->advise(segment.base, segment.size, Advice::kSetPreferredLocation,
                     kCpuDevice);
    runtime_->advise(segment.base, segment.size, Advice::kSetAccessedBy,
                     runtime_->current_device());
  } else {
    runtime_->advise(segment.base, segment.size, Advice::kSetPreferredLocation,
                     segment.home);
  }
}

void CachingManagedAllocator::throw_oom(std::size_t requested, std::size_t rounded,
                                        const Placement& where, const char* why) {
  stats_.count(&MemoryStats::num_ooms, where.home);
  if (observer_) {
    observer_({AllocatorEvent::kOom, nullptr, requested, where.home, where.stream, where.pool});
  }
  const auto& reserved = stats_.total().reserved_bytes.all().current;
  const auto& allocated = stats_.total().allocated_bytes.all().current;
  throw OutOfMemoryError(detail::concat(
      "torch_uvm: out of managed memory: ", why, ". Tried to allocate ",
      format_bytes(requested), " (", format_bytes(rounded), " rounded) for ",
      device_name(where.home), "; the cap is ", format_bytes(cap_.cap()), ", ",
      format_bytes(static_cast<std::size_t>(allocated)), " is allocated and ",
      format_bytes(static_cast<std::size_t>(reserved)),
      " reserved after releasing the cache. Free tensors, lower the batch "
      "size, or raise the cap with torch_uvm.set_memory_cap() if the device "
      "has the memory."));
}

void CachingManagedAllocator::notify(AllocatorEvent::Kind kind, const Block* block,
                                     std::size_t size) {
  const Segment& seg = *block->segment;
  observer_({kind, block->ptr, size, seg.home, seg.stream, seg.pool});
}

// ---- free ------------------------------------------------------------------

void CachingManagedAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_blocks_.find(static_cast<char*>(ptr));
  TORCH_UVM_CHECK_ARG(it != live_blocks_.end(), "torch_uvm: free(", hex(ptr),
                      "): not a live allocation of this allocator (it was "
                      "never allocated here, or was already freed)");
  Block* block = it->second;
  live_blocks_.erase(it);
  take_back(block);
  if (block->stream_uses.empty()) {
    return_to_pool(block);
  } else if (captures_underway_ > 0) {
    block->state = BlockState::kPendingFree;
    parked_during_capture_.push_back(block);
  } else {
    defer_free(block);
  }
}

void CachingManagedAllocator::defer_free(Block* block) {
  if (pending_.defer(block)) return_to_pool(block);  // fenced by synchronizing
}

void CachingManagedAllocator::take_back(Block* block) {
  const Segment& seg = *block->segment;
  stats_.decrease(&MemoryStats::allocation, seg.home, seg.small, 1);
  stats_.decrease(&MemoryStats::allocated_bytes, seg.home, seg.small,
                  static_cast<int64_t>(block->size));
  stats_.decrease(&MemoryStats::requested_bytes, seg.home, seg.small,
                  static_cast<int64_t>(block->requested));
  if (block->size >= policy_.config().max_split_size) {
    stats_.decrease(&MemoryStats::oversize_allocations, seg.home, seg.small, 1);
  }
  if (observer_) notify(AllocatorEvent::kFreeRequested, block, block->size);
}

void CachingManagedAllocator::begin_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++captures_underway_;
}

void CachingManagedAllocator::end_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(captures_underway_ > 0, "torch_uvm: end_capture() without begin_capture()");
  if (--captures_underway_ > 0) return;
  // Events recorded now cover everything queued on those streams since the
  // frees: later than needed, never earlier.
  std::vector<Block*> parked;
  parked.swap(parked_during_capture_);
  for (Block* b : parked) defer_free(b);
}

void CachingManagedAllocator::return_to_pool(Block* block) {
  const Segment& seg = *block->segment;
  stats_.decrease(&MemoryStats::active, seg.home, seg.small, 1);
  stats_.decrease(&MemoryStats::active_bytes, seg.home, seg.small,
                  static_cast<int64_t>(block->size));
  if (observer_) notify(AllocatorEvent::kFreeCompleted, block, block->size);
  --block->segment->allocated_blocks;
  block->state = BlockState::kFree;
  block->requested = 0;
  block->stream_uses.clear();
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour && neighbour->state == BlockState::kFree) pool_erase(neighbour);
  }
  pool_insert(coalesce_block(block));
}

void CachingManagedAllocator::pool_insert(Block* block) {
  pool_of(block).insert(block);
  if (block->is_split()) {
    const Segment& seg = *block->segment;
    stats_.increase(&MemoryStats::inactive_split, seg.home, seg.small, 1);
    stats_.increase(&MemoryStats::inactive_split_bytes, seg.home, seg.small,
                    static_cast<int64_t>(block->size));
  }
}

void CachingManagedAllocator::pool_erase(Block* block) {
  pool_of(block).erase(block);
  if (block->is_split()) {
    const Segment& seg = *block->segment;
    stats_.decrease(&MemoryStats::inactive_split, seg.home, seg.small, 1);
    stats_.decrease(&MemoryStats::inactive_split_bytes, seg.home, seg.small,
                    static_cast<int64_t>(block->size));
  }
}

void CachingManagedAllocator::drain_pending() {
  for (Block* b : pending_.take_completed()) return_to_pool(b);
}

void CachingManagedAllocator::drain_pending_waiting(std::unique_lock<std::mutex>& lock) {
  drain_pending();
  auto events = pending_.detach();
  if (events.empty()) return;
  stats_.count(&MemoryStats::num_sync_all_streams, kCpuDevice);
  ++in_flight_;
  lock.unlock();
  std::vector<bool> done;
  pending_.wait(events, done);  // touches no shared state
  lock.lock();
  // An event whose wait failed is parked again, its block kept.
  for (Block* b : pending_.settle(events, done)) return_to_pool(b);
  --in_flight_;
  settled_.notify_all();
}

void CachingManagedAllocator::wait_until_settled(std::unique_lock<std::mutex>& lock) {
  settled_.wait(lock, [this] { return in_flight_ == 0; });
}

// ---- streams and lookup ----------------------------------------------------

Block* CachingManagedAllocator::find_live_block(const void* ptr) const {
  auto* p = static_cast<char*>(const_cast<void*>(ptr));
  auto it = live_blocks_.upper_bound(p);
  if (it == live_blocks_.begin()) return nullptr;
  --it;
  Block* b = it->second;
  return p < b->ptr + b->size ? b : nullptr;
}

void CachingManagedAllocator::record_stream(const void* ptr, StreamRef stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = find_live_block(ptr);
  TORCH_UVM_CHECK_ARG(block != nullptr, "torch_uvm: record_stream(", hex(ptr),
                      "): not a live allocation of this allocator");
  // CPU work is synchronous, and the allocation stream is ordered already.
  if (stream.device == kCpuDevice || stream == block->segment->stream) return;
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) {
    uses.push_back(stream);
  }
}

std::optional<AllocationInfo> CachingManagedAllocator::find_allocation(
    const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = find_live_block(ptr);
  if (b == nullptr) return std::nullopt;
  return AllocationInfo{b->ptr, b->size, b->requested, b->segment->home,
                        b->segment->stream};
}

std::pair<void*, std::size_t> CachingManagedAllocator::segment_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* p = static_cast<char*>(const_cast<void*>(ptr));
  auto it = segments_.upper_bound(p);
  if (it == segments_.begin()) return {nullptr, 0};
  --it;
  const Segment* s = it->second;
  if (p >= s->base + s->size) return {nullptr, 0};
  return {s->base, s->size};
}

// ---- releasing the cache ---------------------------------------------------

std::vector<Segment*> CachingManagedAllocator::detach_releasable(std::size_t keep) {
  // Free segments, largest first: the fewest runtime calls return the most.
  std::vector<Segment*> free_segments;
  std::size_t cached = 0;
  for (auto& [base, segment] : segments_) {
    if (segment->allocated_blocks == 0 && releasable(*segment)) {
      free_segments.push_back(segment);
      cached += segment->size;
    }
  }
  std::sort(free_segments.begin(), free_segments.end(),
            [](const Segment* a, const Segment* b) { return a->size > b->size; });
  std::vector<Segment*> detached;
  std::size_t released = 0;
  for (Segment* segment : free_segments) {
    if (cached - released <= keep) break;
    if (cached - released - segment->size < keep) continue;  // keep it whole
    released += segment->size;
    pool_erase(segment->head);  // a fully free segment is one block
    segments_.erase(segment->base);
    releasing_.push_back(segment);
    detached.push_back(segment);
  }
  return detached;
}

std::string CachingManagedAllocator::free_detached(std::vector<Segment*> segments,
                                                   std::unique_lock<std::mutex>& lock) {
  if (segments.empty()) return "";
  auto before = before_release_;
  auto after = after_release_;
  ++in_flight_;
  lock.unlock();
  std::vector<bool> freed(segments.size(), false);
  std::string error;
  try {
    if (before) before();
    for (std::size_t i = 0; i < segments.size(); ++i) {
      try {
        runtime_->free_managed(segments[i]->base);
        freed[i] = true;
      } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
      }
    }
  } catch (const std::exception& e) {
    if (error.empty()) error = e.what();
  }
  try {
    if (after) after();
  } catch (const std::exception& e) {
    if (error.empty()) error = e.what();
  }
  lock.lock();
  for (std::size_t i = 0; i < segments.size(); ++i) {
    Segment* segment = segments[i];
    releasing_.erase(std::find(releasing_.begin(), releasing_.end(), segment));
    if (!freed[i]) {  // back to the cache, as it was
      segments_.emplace(segment->base, segment);
      pool_insert(segment->head);
      continue;
    }
    if (segment->pool != kDefaultPool) --pools_[segment->pool].segments;
    const bool small = segment->small;
    const DeviceIndex home = segment->home;
    if (observer_) notify(AllocatorEvent::kSegmentFree, segment->head, segment->size);
    stats_.count(&MemoryStats::num_device_free, home);
    stats_.decrease(&MemoryStats::segment, home, small, 1);
    stats_.decrease(&MemoryStats::reserved_bytes, home, small, static_cast<int64_t>(segment->size));
    if (segment->size >= policy_.config().max_split_size) {
      stats_.decrease(&MemoryStats::oversize_segments, home, small, 1);
    }
    delete segment->head;
    delete segment;
  }
  forget_empty_pools();
  --in_flight_;
  settled_.notify_all();
  return error;
}

void CachingManagedAllocator::empty_cache() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (captures_underway_ > 0) return;
  drain_pending_waiting(lock);
  if (captures_underway_ > 0) return;  // one began while we waited
  std::string error = release_cached(release_threshold_, lock);
  if (!error.empty()) {
    throw RuntimeError("torch_uvm: empty_cache could not return a segment to the driver (" +
                       error + "); it stays cached and is tried again next time");
  }
}

// ---- statistics, cap -------------------------------------------------------

MemoryStats CachingManagedAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.total();
}

MemoryStats CachingManagedAllocator::stats(DeviceIndex home) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(home >= kCpuDevice && home < device_count_,
                      "torch_uvm: no statistics for device ", home, ": valid devices are "
                      "cpu (-1) and 0..", device_count_ - 1);
  return stats_.home(home);
}

void CachingManagedAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_peak();
}

void CachingManagedAllocator::reset_peak_stats(DeviceIndex home) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(home >= kCpuDevice && home < device_count_,
                      "torch_uvm: no statistics for device ", home);
  stats_.reset_peak(home);
}

void CachingManagedAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_accumulated();
}

void CachingManagedAllocator::reset_accumulated_stats(DeviceIndex home) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_UVM_CHECK_ARG(home >= kCpuDevice && home < device_count_,
                      "torch_uvm: no statistics for device ", home);
  stats_.reset_accumulated(home);
}

std::size_t CachingManagedAllocator::cap() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cap_.cap();
}

bool CachingManagedAllocator::reserve_outside(std::size_t bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto fits = [&] {
    return cap_.admits(static_cast<std::size_t>(stats_.total().reserved_bytes.all().current) +
                           outside_, bytes);
  };
  if (!fits() && captures_underway_ == 0) {  // as an allocation would: the cache goes first
    drain_pending_waiting(lock);
    if (captures_underway_ == 0) release_cached(/*keep=*/0, lock);
  }
  if (!fits()) return false;
  outside_ += bytes;
  return true;
}

void CachingManagedAllocator::release_outside(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  outside_ -= std::min(bytes, outside_);
}

std::size_t CachingManagedAllocator::outside_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outside_;
}

std::size_t CachingManagedAllocator::safe_cap_limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cap_.safe_limit();
}

void CachingManagedAllocator::set_cap(std::size_t bytes,
                                      bool allow_oversubscription) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_until_settled(lock);  // bytes being freed by another thread still count
  auto reserved = [&] {
    return static_cast<std::size_t>(stats_.total().reserved_bytes.all().current);
  };
  if (reserved() > bytes && captures_underway_ == 0) {
    drain_pending_waiting(lock);
    if (captures_underway_ == 0) release_cached(/*keep=*/0, lock);
  }
  TORCH_UVM_CHECK_ARG(
      reserved() <= bytes, "torch_uvm: cannot set the managed memory cap to ",
      format_bytes(bytes), ": ", format_bytes(reserved()),
      " is in use by live tensors. Free tensors first, or choose a cap of at "
      "least that.");
  // The opt-in holds for this cap only (memory_cap.h).
  cap_.set(bytes, allow_oversubscription);
  stats_.set(&MemoryStats::cap_bytes, static_cast<int64_t>(bytes));
}

void CachingManagedAllocator::set_memory_fraction(DeviceIndex device, double fraction) {
  std::unique_lock<std::mutex> lock(mutex_);
  cap_.set_fraction(device, fraction);
  if (reserved_on(device) > cap_.fraction_limit(device) && captures_underway_ == 0) {
    drain_pending_waiting(lock);
    if (captures_underway_ == 0) release_cached(/*keep=*/0, lock);
  }
}

double CachingManagedAllocator::memory_fraction(DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cap_.fraction(device);
}

void CachingManagedAllocator::set_release_hooks(std::function<void()> before,
                                                std::function<void()> after) {
  std::lock_guard<std::mutex> lock(mutex_);
  before_release_ = std::move(before);
  after_release_ = std::move(after);
}

void CachingManagedAllocator::set_observer(AllocatorObserver observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  observer_ = std::move(observer);
}

std::string CachingManagedAllocator::take_hint_error() {
  // Asked on every move: the lock only when there is something to take.
  if (!has_hint_error_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  has_hint_error_.store(false, std::memory_order_relaxed);
  std::string error;
  error.swap(hint_error_);
  return error;
}

void CachingManagedAllocator::set_release_threshold(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  release_threshold_ = bytes;
}

}  // namespace torch_uvm
