// Where a share's slots are placed (core/slot_arena.h): one range, next fit,
// coalesced anywhere in it, reused in stream order.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/errors.h"
#include "core/slot_arena.h"
#include "runtime/host_runtime.h"

namespace torch_uvm {
namespace {

constexpr std::size_t kMiB = 1 << 20;
const StreamRef kBring{0, 0x10}, kCompute{0, 0x20};

class SlotArenaTest : public testing::Test {
 protected:
  HostRuntime runtime_{1, 1ull << 30};
  std::vector<char> memory_ = std::vector<char>(8 * kMiB);
  char* base() { return memory_.data(); }
  SlotArena arena_{runtime_, memory_.data(), 8 * kMiB, kBring};
};

// Freed neighbours merge wherever they are, so slots of mixed sizes reuse
// the one range: nothing is ever held beside it.
TEST_F(SlotArenaTest, MixedSizesReuseTheOneRangeCoalescedAnywhere) {
  void* a = arena_.allocate(3 * kMiB);
  void* b = arena_.allocate(kMiB);
  void* c = arena_.allocate(4 * kMiB);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a, base());
  EXPECT_EQ(arena_.allocate(1), nullptr);        // full: never more memory
  arena_.free(a);
  arena_.free(b);
  void* d = arena_.allocate(4 * kMiB);           // a's and b's room, merged
  EXPECT_EQ(d, base());
  arena_.free(c);
  arena_.free(d);
  EXPECT_EQ(arena_.allocate(8 * kMiB), base());  // the whole range again
  EXPECT_EQ(arena_.stats().allocated, 8 * kMiB);
  EXPECT_EQ(arena_.stats().allocated_peak, 8 * kMiB);
  EXPECT_EQ(arena_.stats().waits, 0u);
}

// Slots go round the range as a ring: the next goes into the first free
// block that fits from the end of the last one placed, wrapping round.
TEST_F(SlotArenaTest, SlotsGoRoundTheRangeFromTheLastOnePlaced) {
  void* a = arena_.allocate(kMiB);
  void* b = arena_.allocate(kMiB);
  void* c = arena_.allocate(3 * kMiB);
  void* d = arena_.allocate(kMiB);
  ASSERT_TRUE(a && b && c && d);                 // 2 MiB left at the end
  arena_.free(a);                                // a hole at the start
  EXPECT_EQ(arena_.allocate(kMiB), base() + 6 * kMiB);   // after d, not in a's hole
  EXPECT_EQ(arena_.allocate(kMiB), base() + 7 * kMiB);
  EXPECT_EQ(arena_.allocate(kMiB), a);           // round again
  arena_.free(c);
  arena_.free(b);                                // b and c merge: 4 MiB from 1 MiB
  EXPECT_EQ(arena_.allocate(2 * kMiB), b);
  EXPECT_EQ(arena_.allocate(2 * kMiB), base() + 3 * kMiB);
  EXPECT_EQ(arena_.allocate(1), nullptr);
}

TEST_F(SlotArenaTest, AnEmptyRangeStartsAgainAtItsBeginning) {
  void* a = arena_.allocate(kMiB);
  void* b = arena_.allocate(kMiB);
  arena_.free(a);
  arena_.free(b);
  EXPECT_EQ(arena_.allocate(kMiB), base());      // not after b
}

// A slot another stream used is not reused before that stream passed its
// free: with no room, the arena waits for it rather than say no.
TEST_F(SlotArenaTest, ASlotAnotherStreamUsedIsReusedOnlyOnceThatStreamPassed) {
  runtime_.set_auto_complete_events(false);
  void* a = arena_.allocate(4 * kMiB);
  void* b = arena_.allocate(4 * kMiB);
  arena_.record_stream(a, kCompute);
  arena_.record_stream(b, kBring);               // its own stream: reused at once
  arena_.free(a);
  arena_.free(b);
  EXPECT_EQ(arena_.allocate(4 * kMiB), b);       // b at once, a still pending
  EXPECT_EQ(arena_.stats().waits, 0u);
  EXPECT_EQ(arena_.allocate(4 * kMiB), a);       // no room: waits for a's stream
  EXPECT_EQ(arena_.stats().waits, 1u);
  arena_.free(a);
  runtime_.complete_events();
  EXPECT_EQ(arena_.allocate(4 * kMiB), a);       // its own stream: no wait
  EXPECT_EQ(arena_.stats().waits, 1u);
}

// A draw that need not happen now (a bring beyond an offload's window)
// says no where only pending frees would make room: the host does not wait
// for the GPU for it. A draw that must happen waits, as before.
TEST_F(SlotArenaTest, ADrawThatNeedNotWaitTakesNoPendingFree) {
  runtime_.set_auto_complete_events(false);
  void* a = arena_.allocate(8 * kMiB);
  arena_.record_stream(a, kCompute);
  arena_.free(a);
  EXPECT_TRUE(arena_.allocate_all({4 * kMiB}, /*wait=*/false).empty());
  EXPECT_EQ(arena_.stats().waits, 0u);
  EXPECT_EQ(arena_.stats().allocated, 0u);
  runtime_.complete_events();                    // a's stream passed: taken, no wait
  auto one = arena_.allocate_all({4 * kMiB}, /*wait=*/false);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], a);
  EXPECT_EQ(arena_.stats().waits, 0u);
}

// Slots drawn together (a submodule's tensors) all find room, or none is
// taken: a failed try leaves the range and the cursor as they were.
TEST_F(SlotArenaTest, SlotsDrawnTogetherAllFindRoomOrNoneIsTaken) {
  runtime_.set_auto_complete_events(false);
  void* a = arena_.allocate(8 * kMiB);
  EXPECT_TRUE(arena_.allocate_all({1}).empty());
  arena_.record_stream(a, kCompute);
  arena_.free(a);
  auto two = arena_.allocate_all({4 * kMiB, 4 * kMiB});   // once a's stream passed: waited for
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], a);
  EXPECT_EQ(arena_.stats().waits, 1u);
  arena_.free(two[0]);
  arena_.free(two[1]);
  void* p[4];
  for (void*& q : p) q = arena_.allocate(2 * kMiB);       // [0,2) [2,4) [4,6) [6,8)
  arena_.free(p[0]);
  arena_.free(p[2]);                                      // holes at 0 and 4; the cursor at 8
  EXPECT_TRUE(arena_.allocate_all({2 * kMiB, 3 * kMiB}).empty());   // 2 at 0, then no 3
  EXPECT_EQ(arena_.stats().allocated, 4 * kMiB);          // nothing taken
  EXPECT_EQ(arena_.allocate(kMiB), p[0]);                 // from the cursor at 8, not at 2
}

TEST_F(SlotArenaTest, BadInputIsRefusedNamingIt) {
  int elsewhere = 0;
  EXPECT_THROW(arena_.free(&elsewhere), InvalidArgument);
  EXPECT_THROW(arena_.record_stream(&elsewhere, kCompute), InvalidArgument);
  EXPECT_THROW(SlotArena(runtime_, base(), 100, kBring), InvalidArgument);
}

}  // namespace
}  // namespace torch_uvm
