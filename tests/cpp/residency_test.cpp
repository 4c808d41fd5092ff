// The residency budget's policy: what is evicted, in which order, and how.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "core/residency.h"

namespace torch_uvm {
namespace {

constexpr std::size_t kMiB = 1 << 20;

TEST(Residency, EvictsLeastRecentlyUsedFirstAndStaysWithinTheBudget) {
  ResidencyBudget b;
  b.set_limit(0, 3 * kMiB);
  EXPECT_TRUE(b.admit(0, 0x1000, kMiB, false).empty());
  EXPECT_TRUE(b.admit(0, 0x2000, kMiB, false).empty());
  EXPECT_TRUE(b.admit(0, 0x3000, kMiB, false).empty());
  EXPECT_TRUE(b.admit(0, 0x1000, kMiB, false).empty());  // touched: now most recent
  auto steps = b.admit(0, 0x4000, 2 * kMiB, false);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].address, 0x2000u);
  EXPECT_EQ(steps[1].address, 0x3000u);
  EXPECT_EQ(b.stats(0).resident_bytes, 3 * kMiB);
  EXPECT_EQ(b.stats(0).peak_resident_bytes, 3 * kMiB);
  EXPECT_TRUE(b.is_resident(0, 0x1000));
  EXPECT_FALSE(b.is_resident(0, 0x2000));
}

TEST(Residency, CleanRangesDropTheirCopyAndWrittenOnesMigrate) {
  ResidencyBudget b;
  b.set_limit(0, 2 * kMiB);
  b.admit(0, 0x1000, kMiB, false);
  b.admit(0, 0x2000, kMiB, false);
  b.mark_written(0x2000);
  auto steps = b.admit(0, 0x3000, 2 * kMiB, true);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].how, Eviction::kDropCopy);
  EXPECT_EQ(steps[1].how, Eviction::kMigrate);
  auto s = b.stats(0);
  EXPECT_EQ(s.evictions[0], 1u);
  EXPECT_EQ(s.evicted_bytes[1], kMiB);
  EXPECT_EQ(s.prefetched_bytes, 4 * kMiB);
}

TEST(Residency, BusyRangesAreNeverEvicted) {
  ResidencyBudget b;
  b.set_limit(0, 2 * kMiB);
  b.admit(0, 0x1000, kMiB, false);
  b.admit(0, 0x2000, kMiB, false);
  b.set_busy(0x1000, true);
  EXPECT_TRUE(b.is_busy(0x1000));
  EXPECT_FALSE(b.is_busy(0x2000));
  EXPECT_FALSE(b.is_busy(0x9000));  // unknown
  auto steps = b.admit(0, 0x3000, kMiB, false);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].address, 0x2000u);
  b.set_busy(0x3000, true);
  // Nothing left to evict: refused, and nothing changed.
  EXPECT_THROW(b.admit(0, 0x4000, kMiB, false), InvalidArgument);
  EXPECT_EQ(b.stats(0).resident_bytes, 2 * kMiB);
  EXPECT_TRUE(b.is_resident(0, 0x1000));
  EXPECT_TRUE(b.is_resident(0, 0x3000));
}

TEST(Residency, BadInputAndForgottenRanges) {
  ResidencyBudget b;
  EXPECT_THROW(b.set_limit(0, 0), InvalidArgument);
  EXPECT_THROW(b.set_limit(kCpuDevice, kMiB), InvalidArgument);
  b.set_limit(0, kMiB);
  EXPECT_THROW(b.admit(0, 0x1000, 2 * kMiB, false), InvalidArgument);
  b.admit(0, 0x1000, kMiB, false);
  b.forget(0x1000);
  EXPECT_EQ(b.stats(0).resident_bytes, 0u);
  EXPECT_TRUE(b.admit(0, 0x2000, kMiB, false).empty());
  // Without a budget nothing is evicted, but residency is still counted.
  b.set_limit(0, std::nullopt);
  EXPECT_TRUE(b.admit(0, 0x3000, 8 * kMiB, false).empty());
  EXPECT_EQ(b.stats(0).resident_bytes, 9 * kMiB);
  // The same range admitted on another device leaves the first.
  b.admit(1, 0x3000, 8 * kMiB, false);
  EXPECT_EQ(b.stats(0).resident_bytes, kMiB);
  EXPECT_TRUE(b.is_resident(1, 0x3000));
}

}  // namespace
}  // namespace torch_uvm
