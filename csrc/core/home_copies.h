// The copies home under way of one offloaded module's share, and the one
// throttle on them. A written slot let go is freed only once its copy home
// passes; drawn before that, a new slot would be new GPU memory. So the
// budget counts such bytes as leaving (ResidencyBudget::leaving) until the
// copy passes, and the host waits for the oldest copy:
// * before drawing or making GPU memory, while they hold the share over
//   its budget (make_room): the GPU then holds no more than the budget, in
//   memory as in the books;
// * in a backward whose gradients go home unwaited for (a host step), while
//   more than a share of the budget is under way from memory beside the
//   share's slots (gradients, in PyTorch's allocator: at_most): the host
//   queues kernels far ahead of the GPU, and PyTorch's allocator would
//   reserve more the further it ran.
// Policy over the runtime's events (core/runtime.h): tested on HostRuntime.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>

#include "core/residency.h"
#include "core/runtime.h"
#include "core/runtime_event.h"

namespace torch_uvm {

class HomeCopies {
 public:
  // Called with the bytes of the copy the host is about to wait for; what it
  // returns lives until the wait ends (a trace's range).
  using OnWait = std::function<std::shared_ptr<void>(std::size_t)>;

  // `share`: an open share of `budget` (its GPU is the budget's to say).
  HomeCopies(Runtime& runtime, ResidencyBudget& budget, ShareId share, OnWait on_wait = nullptr);
  // Copies pending at destruction are left to the runtime: the share closes
  // with its books.

  // Copies of `bytes` home were queued on `stream`, up to now; `beside` of
  // them from memory beside the share's slots (at_most counts those).
  void queued(std::size_t bytes, std::size_t beside, StreamRef stream);
  // Those that passed leave the books.
  void reap();
  // Waits, oldest first, while copies under way hold the share over its
  // budget with `extra` bytes more (0 when waiting could not help:
  // ResidencyBudget::excess).
  void make_room(std::size_t extra = 0);
  // Waits, oldest first, while more than `limit` bytes from beside the
  // slots are under way, down to the newest copy alone.
  void at_most(std::size_t limit);
  // `stream`'s later work waits for every copy home queued so far.
  void block(StreamRef stream) const { last_.block(stream); }

  std::size_t bytes_under_way() const { return under_way_; }
  std::size_t beside_under_way() const { return beside_; }
  std::size_t copies_under_way() const { return pending_.size(); }

 private:
  void wait_oldest();  // the host waits for the oldest copy, which then leaves the books
  void pass_oldest();  // the oldest copy passed: it leaves the books

  Runtime& runtime_;
  ResidencyBudget& budget_;
  DeviceIndex device_;
  ShareId share_;
  OnWait on_wait_;
  struct Pending {
    std::unique_ptr<RuntimeEvent> done;
    std::size_t bytes;
    std::size_t beside;
  };
  std::deque<Pending> pending_;  // oldest first
  std::size_t under_way_ = 0;
  std::size_t beside_ = 0;
  RuntimeEvent last_;  // after the last copy queued
};

}  // namespace torch_uvm
