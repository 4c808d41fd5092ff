// The residency budget's policy: what is evicted, in which order, and how.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(Residency, CleanRangesAreDroppedAndWrittenOnesGoHome) {
  ResidencyBudget b;
  b.set_limit(0, 2 * kMiB);
  b.admit(0, 0x1000, kMiB, false);
  b.admit(0, 0x2000, kMiB, false);
  b.mark_written(0x2000);
  auto steps = b.admit(0, 0x3000, 2 * kMiB, true);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].how, Eviction::kDrop);
  EXPECT_EQ(steps[1].how, Eviction::kWriteHome);
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


// A 4 MiB share holding three 1 MiB ranges, 0x1000 (oldest) to 0x3000.
ShareId share_of_three(ResidencyBudget& b, bool first_written) {
  const ShareId s = b.open_share(0, 4 * kMiB, "M", 64 * kMiB);
  b.admit(0, 0x1000, kMiB, first_written, s);
  b.admit(0, 0x2000, kMiB, false, s);
  b.admit(0, 0x3000, kMiB, false, s);
  return s;
}

// A written range evicted with its copy home under way still holds its GPU
// memory: it counts until the copy passes, and room for a new range is made
// around it (the slots' real memory, not only the books, stays within).
TEST(Residency, CopiesHomeUnderWayCountUntilTheyPass) {
  ResidencyBudget b;
  const ShareId s = share_of_three(b, /*first_written=*/true);
  ASSERT_EQ(b.evict(0x1000), Eviction::kWriteHome);
  b.leaving(0, s, kMiB);                              // its copy home is queued
  EXPECT_EQ(b.share_stats(s).resident_bytes, 2 * kMiB);
  EXPECT_EQ(b.share_stats(s).leaving_bytes, kMiB);
  EXPECT_EQ(b.stats(0).leaving_bytes, kMiB);
  EXPECT_EQ(b.excess(0, s), 0u);
  // 2 MiB more: the leaving MiB is not free, so the oldest clean one goes
  auto steps = b.admit(0, 0x4000, 2 * kMiB, false, s);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].address, 0x2000u);
  EXPECT_EQ(b.excess(0, s), 0u);
  EXPECT_EQ(b.share_stats(s).peak_resident_bytes, 4 * kMiB);
  // a busy range and the leaving one: 2 MiB more fits once the copy passes,
  // and until then the share is over by the leaving MiB
  b.set_busy(0x4000, true);
  steps = b.admit(0, 0x5000, 2 * kMiB, false, s);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].address, 0x3000u);
  EXPECT_EQ(b.excess(0, s), kMiB);
  // it arrives once the copy passes (the caller waits while excess() says
  // so): never held beside it
  EXPECT_EQ(b.share_stats(s).peak_resident_bytes, 4 * kMiB);
  b.left(0, s, kMiB);
  EXPECT_EQ(b.excess(0, s), 0u);
  EXPECT_EQ(b.share_stats(s).leaving_bytes, 0u);
  // what never left cannot pass; a busy share past its budget still refuses
  EXPECT_THROW(b.left(0, s, 1), InvalidArgument);
  b.set_busy(0x5000, true);
  EXPECT_THROW(b.admit(0, 0x6000, kMiB, false, s), InvalidArgument);
  // memory made on the GPU (adopted) beside a copy home under way is held
  // at once: the peak says so
  b.mark_written(0x5000);
  ASSERT_EQ(b.evict(0x5000), Eviction::kWriteHome);
  b.leaving(0, s, 2 * kMiB);
  EXPECT_EQ(b.share_stats(s).peak_resident_bytes, 4 * kMiB);
  EXPECT_TRUE(b.admit(0, 0x7000, kMiB, true, s, /*arrives=*/false).empty());
  EXPECT_EQ(b.excess(0, s), kMiB);
  EXPECT_EQ(b.share_stats(s).peak_resident_bytes, 5 * kMiB);
  // a share closed with copies under way takes them off the GPU's figures
  b.leaving(0, s, kMiB);
  b.close_share(s);
  EXPECT_EQ(b.stats(0).leaving_bytes, 0u);
  EXPECT_EQ(b.stats(0).resident_bytes, 0u);
}

// Memory about to be made on the GPU (a backward's gradients) gets room
// before it exists, around the copies home under way.
TEST(Residency, RoomIsMadeForMemoryAboutToBeMade) {
  ResidencyBudget b;
  const ShareId s = share_of_three(b, /*first_written=*/false);
  b.set_busy(0x3000, true);
  b.leaving(0, s, kMiB);
  EXPECT_EQ(b.excess(0, s, 2 * kMiB), 0u);           // over by 2: waiting for 1 would not do
  auto steps = b.make_room(0, s, 2 * kMiB);         // the two clean ones, oldest first
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].address, 0x1000u);
  EXPECT_EQ(steps[1].address, 0x2000u);
  EXPECT_EQ(b.excess(0, s, 2 * kMiB), 0u);
  EXPECT_EQ(b.share_stats(s).resident_bytes, kMiB);  // nothing admitted
  EXPECT_TRUE(b.make_room(0, s, 3 * kMiB).empty());   // busy and leaving: wait for the copy
  EXPECT_EQ(b.excess(0, s, 3 * kMiB), kMiB);
  b.left(0, s, kMiB);
  EXPECT_EQ(b.excess(0, s, 3 * kMiB), 0u);
}

// Memory made on the GPU (adopted) that evicts a written range is held
// beside it until its copy home passes: the peak counts both. An arrival
// that evicts it is drawn only after the copy (the caller waits): not both.
TEST(Residency, MemoryMadeOnTheGpuIsHeldBesideTheWrittenRangesItEvicts) {
  ResidencyBudget b;
  const ShareId s = share_of_three(b, /*first_written=*/true);
  auto steps = b.admit(0, 0x4000, 2 * kMiB, true, s, /*arrives=*/false);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].how, Eviction::kWriteHome);
  EXPECT_EQ(b.share_stats(s).peak_resident_bytes, 5 * kMiB);
  EXPECT_EQ(b.stats(0).peak_resident_bytes, 5 * kMiB);
  b.leaving(0, s, kMiB);                              // as the caller reports it
  EXPECT_EQ(b.share_stats(s).peak_resident_bytes, 5 * kMiB);
  b.left(0, s, kMiB);
  b.reset_peak(0);
  b.mark_written(0x2000);
  steps = b.admit(0, 0x5000, kMiB, false, s);         // arrives: waits for the copy
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].address, 0x2000u);
  EXPECT_EQ(b.share_stats(s).peak_resident_bytes, 4 * kMiB);
}

// Waiting for copies home helps only when they are what holds the share
// over its budget: ranges in use that hold it over say 0 (no wait).
TEST(Residency, ExcessIsWhatCopiesHomePassingCanFree) {
  ResidencyBudget b;
  const ShareId s = share_of_three(b, /*first_written=*/false);
  for (std::uintptr_t a : {0x1000, 0x2000, 0x3000}) b.set_busy(a, true);
  b.admit(0, 0x4000, kMiB, true, s);
  b.set_busy(0x4000, true);
  b.mark_written(0x4000);
  b.set_busy(0x4000, false);
  ASSERT_EQ(b.evict(0x4000), Eviction::kWriteHome);
  b.leaving(0, s, kMiB);
  EXPECT_EQ(b.excess(0, s, kMiB), kMiB);              // 3 busy + 1 leaving + 1: wait for it
  EXPECT_EQ(b.excess(0, s, 2 * kMiB), 0u);            // over by 2, 1 can pass: no use waiting
  EXPECT_EQ(b.excess(0, kDeviceShare), 0u);           // the device share, never used
  b.left(0, s, kMiB);
  EXPECT_EQ(b.excess(0, s, kMiB), 0u);
}

// Room the books have but not in one piece: the least recently used range
// not busy leaves, as an eviction would send it.
TEST(Residency, TheLeastRecentRangeNotBusyLeavesOnDemand) {
  ResidencyBudget b;
  const ShareId s = share_of_three(b, /*first_written=*/true);
  b.set_busy(0x1000, true);
  auto step = b.evict_least_recent(0, s);
  ASSERT_TRUE(step);
  EXPECT_EQ(step->address, 0x2000u);
  EXPECT_EQ(step->how, Eviction::kDrop);
  b.set_busy(0x1000, false);
  step = b.evict_least_recent(0, s);
  ASSERT_TRUE(step);
  EXPECT_EQ(step->address, 0x1000u);
  EXPECT_EQ(step->how, Eviction::kWriteHome);
  EXPECT_EQ(b.share_stats(s).evictions[static_cast<int>(Eviction::kWriteHome)], 1u);
  b.set_busy(0x3000, true);
  EXPECT_FALSE(b.evict_least_recent(0, s));
  EXPECT_EQ(b.share_stats(s).resident_bytes, kMiB);
  // only those the caller accepts (its ranges in one arena)
  b.set_busy(0x3000, false);
  b.admit(0, 0x4000, kMiB, false, s);
  step = b.evict_least_recent(0, s, [](std::uintptr_t a) { return a == 0x4000; });
  ASSERT_TRUE(step);
  EXPECT_EQ(step->address, 0x4000u);
  EXPECT_TRUE(b.is_resident(0, 0x3000));
}

// A bring put off after its admit leaves no trace in the books.
TEST(Residency, AWithdrawnAdmissionLeavesTheBooksAsTheyWere) {
  ResidencyBudget b;
  const ShareId s = share_of_three(b, /*first_written=*/false);
  const ResidencyStats before = b.share_stats(s);
  b.admit(0, 0x4000, kMiB, false, s);
  b.withdraw(0x4000);
  EXPECT_FALSE(b.is_resident(0, 0x4000));
  EXPECT_EQ(b.share_stats(s).resident_bytes, before.resident_bytes);
  EXPECT_EQ(b.share_stats(s).prefetched_bytes, before.prefetched_bytes);
  EXPECT_EQ(b.stats(0).prefetched_bytes, before.prefetched_bytes);
}

TEST(Residency, EachShareIsItsOwnBudgetWhateverTheOrder) {
  ResidencyBudget b;
  const std::size_t cap = 64 * kMiB;
  // No limit: two offloads each get their budget, and one evicts only its own.
  ShareId a = b.open_share(0, 2 * kMiB, "A", cap);
  ShareId c = b.open_share(0, 2 * kMiB, "C", cap);
  EXPECT_TRUE(b.admit(0, 0x1000, 2 * kMiB, false, a).empty());
  EXPECT_TRUE(b.admit(0, 0x2000, kMiB, false, c).empty());
  EXPECT_TRUE(b.admit(0, 0x3000, kMiB, false, c).empty());
  auto steps = b.admit(0, 0x4000, kMiB, false, c);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].address, 0x2000u);     // C's own, never A's
  EXPECT_TRUE(b.is_resident(0, 0x1000));
  EXPECT_EQ(b.share_stats(a).resident_bytes, 2 * kMiB);
  EXPECT_EQ(b.share_stats(c).resident_bytes, 2 * kMiB);
  EXPECT_EQ(b.share_stats(c).evictions[0], 1u);
  EXPECT_EQ(b.stats(0).resident_bytes, 4 * kMiB);
  EXPECT_EQ(b.shares(0).size(), 2u);
  EXPECT_TRUE(b.has_budget(0));
  EXPECT_FALSE(b.has_budget(1));
  // Closing a share lets go of its ranges.
  b.close_share(a);
  EXPECT_EQ(b.stats(0).resident_bytes, 2 * kMiB);
  EXPECT_FALSE(b.is_resident(0, 0x1000));
  b.close_share(a);  // twice: nothing
}

TEST(Residency, ASharePastTheLimitOrTheCeilingIsRefusedNamingTheHolders) {
  ResidencyBudget b;
  ShareId a = b.open_share(0, 48 * kMiB, "GPT2LMHeadModel", 64 * kMiB);
  try {
    b.open_share(0, 32 * kMiB, "Sequential", 64 * kMiB);
    FAIL() << "a share past the ceiling was opened";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("GPT2LMHeadModel (50331648 bytes)"), std::string::npos) << what;
    EXPECT_NE(what.find("Sequential"), std::string::npos) << what;
  }
  EXPECT_EQ(b.shares(0).size(), 1u);  // nothing changed
  // A limit bounds the shares' sum, and cannot drop below it.
  EXPECT_THROW(b.set_limit(0, 32 * kMiB), InvalidArgument);
  EXPECT_FALSE(b.limit(0).has_value());
  b.set_limit(0, 56 * kMiB);
  EXPECT_THROW(b.open_share(0, 16 * kMiB, "B", 1024 * kMiB), InvalidArgument);
  ShareId c = b.open_share(0, 8 * kMiB, "B", 1024 * kMiB);
  // The device's own share gets what the limit leaves: nothing here.
  EXPECT_THROW(b.admit(0, 0x9000, kMiB, false), InvalidArgument);
  b.close_share(c);
  EXPECT_TRUE(b.admit(0, 0x9000, 8 * kMiB, false).empty());
  EXPECT_THROW(b.admit(0, 0xa000, kMiB, false, 42), InvalidArgument);  // no such share
  EXPECT_THROW(b.admit(1, 0xa000, kMiB, false, a), InvalidArgument);   // another GPU's
}

TEST(Residency, AnExplicitEvictionIsCountedByHowTheRangeLeaves) {
  ResidencyBudget b;
  ShareId a = b.open_share(0, 4 * kMiB, "A", 64 * kMiB);
  b.admit(0, 0x1000, kMiB, false, a);
  b.admit(0, 0x2000, kMiB, true, a);
  b.mark_clean(0x2000);                      // written back ahead of time
  b.admit(0, 0x3000, kMiB, false, a);
  b.mark_written(0x3000);
  EXPECT_EQ(b.evict(0x1000), Eviction::kDrop);
  EXPECT_EQ(b.evict(0x2000), Eviction::kDrop);
  EXPECT_EQ(b.evict(0x3000), Eviction::kWriteHome);
  EXPECT_FALSE(b.evict(0x3000).has_value());
  auto s = b.share_stats(a);
  EXPECT_EQ(s.evictions[0], 2u);
  EXPECT_EQ(s.evicted_bytes[1], kMiB);
  EXPECT_EQ(s.resident_bytes, 0u);
  EXPECT_EQ(s.peak_resident_bytes, 3 * kMiB);
  b.reset_peak(0);
  EXPECT_EQ(b.share_stats(a).peak_resident_bytes, 0u);
}


TEST(Residency, DeadRangesAreDiscardedAndCounted) {
  ResidencyBudget b;
  b.admit(0, 0x1000, kMiB, true, kDeviceShare, /*arrives=*/false);  // made on the GPU
  EXPECT_EQ(b.stats(0).prefetched_bytes, 0u);
  EXPECT_EQ(b.stats(0).resident_bytes, kMiB);
  b.discard(0x1000);
  b.discard(0x1000);  // once
  auto s = b.stats(0);
  EXPECT_EQ(s.discards, 1u);
  EXPECT_EQ(s.discarded_bytes, kMiB);
  EXPECT_EQ(s.resident_bytes, 0u);
  EXPECT_EQ(s.evictions[1], 0u);
}

TEST(Residency, ATimelineRecordsEveryArrivalAndDepartureInOrder) {
  ResidencyBudget b;
  b.admit(0, 0x9000, kMiB, false);                 // before the recording: not in it
  b.start_timeline(100);
  const ShareId share = b.open_share(0, 2 * kMiB, "Model", 64 * kMiB);
  b.label(0x1000, "layers.0");
  b.admit(0, 0x1000, kMiB, false, share);                       // arrives
  b.admit(0, 0x2000, kMiB, true, share, /*arrives=*/false);     // made on the GPU
  b.admit(0, 0x3000, kMiB, false, share);          // evicts 0x1000 (clean): a drop
  b.evict(0x2000);                                 // written: goes home
  b.discard(0x3000);
  b.forget(0x9000);
  std::size_t dropped = 99;
  const auto events = b.take_timeline(&dropped);
  EXPECT_EQ(dropped, 0u);
  std::vector<std::string> kinds;
  for (const auto& e : events) kinds.push_back(kind_name(e.kind));
  EXPECT_EQ(kinds, (std::vector<std::string>{"arrive", "adopt", "drop", "arrive", "write_home",
                                             "discard", "forget"}));
  EXPECT_EQ(events[0].label, "layers.0");
  EXPECT_EQ(events[2].label, "layers.0");
  EXPECT_EQ(events[2].share, share);
  EXPECT_EQ(events[1].share_resident, 2 * kMiB);   // the share's bytes after each
  EXPECT_EQ(events[2].share_resident, kMiB);
  EXPECT_EQ(events[3].share_resident, 2 * kMiB);
  EXPECT_EQ(events[3].device_resident, 3 * kMiB);  // the batch at 0x9000 too
  EXPECT_EQ(events[6].device_resident, 0u);
  for (std::size_t i = 1; i < events.size(); ++i) {
    EXPECT_GE(events[i].time_ns, events[i - 1].time_ns);
  }
  EXPECT_TRUE(b.take_timeline().empty());          // stopped
  b.start_timeline(2);                             // a bounded ring: the oldest go
  for (std::uintptr_t a = 0x1000; a < 0x5000; a += 0x1000) b.admit(0, a, kMiB, false);
  const auto last = b.take_timeline(&dropped);
  EXPECT_EQ(dropped, 2u);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].address, 0x3000u);
}

}  // namespace
}  // namespace torch_uvm
