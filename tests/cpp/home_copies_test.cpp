// Copies home under way and the one throttle on them (core/home_copies.h),
// on the host runtime, whose events complete when the test says.
#include <gtest/gtest.h>

#include <vector>

#include "core/errors.h"
#include "core/home_copies.h"
#include "runtime/host_runtime.h"

namespace torch_uvm {
namespace {

constexpr std::size_t kMiB = 1 << 20;

struct Copies {
  HostRuntime rt;
  ResidencyBudget budget;
  ShareId share;
  StreamRef stream;
  std::vector<std::size_t> waits;  // the bytes of each copy waited for, in order
  HomeCopies copies;

  explicit Copies(std::size_t budget_bytes)
      : share(open(budget, budget_bytes)),
        stream(rt.create_stream(0)),
        copies(rt, budget, share, [this](std::size_t bytes) {
          waits.push_back(bytes);
          return std::shared_ptr<void>();
        }) {
    rt.set_auto_complete_events(false);
  }
  static ShareId open(ResidencyBudget& b, std::size_t bytes) {
    b.set_limit(0, 64 * kMiB);
    return b.open_share(0, bytes, "test", 64 * kMiB);
  }
  std::size_t leaving() const { return budget.share_stats(share).leaving_bytes; }
};

TEST(HomeCopies, CopiesCountAsLeavingUntilTheyPass) {
  Copies c(8 * kMiB);
  c.copies.queued(2 * kMiB, 0, c.stream);
  c.copies.queued(kMiB, kMiB, c.stream);
  c.copies.queued(0, 0, c.stream);  // nothing written: nothing under way
  EXPECT_EQ(c.copies.copies_under_way(), 2u);
  EXPECT_EQ(c.copies.bytes_under_way(), 3 * kMiB);
  EXPECT_EQ(c.copies.beside_under_way(), kMiB);
  EXPECT_EQ(c.leaving(), 3 * kMiB);
  c.copies.reap();  // not passed yet
  EXPECT_EQ(c.leaving(), 3 * kMiB);
  c.rt.complete_events();
  c.copies.reap();
  EXPECT_EQ(c.leaving(), 0u);
  EXPECT_EQ(c.copies.bytes_under_way(), 0u);
  EXPECT_EQ(c.copies.beside_under_way(), 0u);
  EXPECT_TRUE(c.waits.empty());
}

// The copies count against their own share, on the share's own GPU: a
// share's id and a GPU's index are both integers, and an executor that gave
// them crossed had its copies counted against no share at all (its books
// then saw no copy under way, and nothing waited for one).
TEST(HomeCopies, CopiesCountOnTheSharesOwnGpu) {
  HostRuntime rt(2);
  ResidencyBudget budget;
  budget.set_limit(1, 64 * kMiB);
  const ShareId share = budget.open_share(1, 8 * kMiB, "test", 64 * kMiB);
  HomeCopies copies(rt, budget, share);
  rt.set_auto_complete_events(false);
  copies.queued(2 * kMiB, 0, rt.create_stream(1));
  EXPECT_EQ(budget.share_stats(share).leaving_bytes, 2 * kMiB);
  EXPECT_EQ(budget.stats(1).leaving_bytes, 2 * kMiB);
  EXPECT_EQ(budget.stats(0).leaving_bytes, 0u);
  EXPECT_THROW(HomeCopies(rt, budget, share + 1), InvalidArgument);  // not open
  EXPECT_THROW(HomeCopies(rt, budget, kDeviceShare), InvalidArgument);
}

TEST(HomeCopies, MakeRoomWaitsForTheOldestWhileTheyHoldTheShareOverItsBudget) {
  Copies c(8 * kMiB);
  c.budget.admit(0, 0x1000, 4 * kMiB, false, c.share);
  for (int k = 0; k < 3; ++k) c.copies.queued(kMiB, 0, c.stream);  // 7 of 8 MiB held
  c.copies.make_room(kMiB);  // 8: fits, no wait
  EXPECT_TRUE(c.waits.empty());
  c.copies.make_room(2 * kMiB);  // 9: the oldest passes first
  EXPECT_EQ(c.waits, (std::vector<std::size_t>{kMiB}));
  EXPECT_EQ(c.leaving(), 2 * kMiB);
  // over the budget even with every copy passed: waiting would not help
  c.copies.make_room(32 * kMiB);
  EXPECT_EQ(c.waits.size(), 1u);
}

TEST(HomeCopies, AtMostWaitsForTheOldestBeyondTheBytesBesideTheSlots) {
  Copies c(64 * kMiB);
  const std::size_t sizes[] = {30, 30, 30, 50, 10, 5};
  for (std::size_t s : sizes) {
    c.copies.queued(s * kMiB, s * kMiB, c.stream);
    c.copies.at_most(100 * kMiB);
  }
  // 90 under way, then 140 > 100: the oldest two go (80 left); then 90, 95
  EXPECT_EQ(c.waits, (std::vector<std::size_t>{30 * kMiB, 30 * kMiB}));
  EXPECT_EQ(c.copies.beside_under_way(), 95 * kMiB);
  c.waits.clear();
  c.copies.queued(1000 * kMiB, 1000 * kMiB, c.stream);  // beyond the limit alone:
  c.copies.at_most(100 * kMiB);                          // waits for the rest only
  EXPECT_EQ(c.waits.size(), 4u);
  EXPECT_EQ(c.copies.copies_under_way(), 1u);
  c.rt.complete_events();
  c.waits.clear();
  for (int k = 0; k < 2; ++k) {  // up to the limit itself: no wait
    c.copies.queued(50 * kMiB, 50 * kMiB, c.stream);
    c.copies.at_most(100 * kMiB);
  }
  EXPECT_TRUE(c.waits.empty());
  // copies from the slots (weights written home) are not counted
  c.copies.queued(500 * kMiB, 0, c.stream);
  c.copies.at_most(100 * kMiB);
  EXPECT_TRUE(c.waits.empty());
}

}  // namespace
}  // namespace torch_uvm
