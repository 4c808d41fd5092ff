// What stays resident of an offloaded module: the run of units at the start
// (or the end) of the order that fits beside the window, the window sized by
// the largest unit that streams, tied pieces counted once.
#include <gtest/gtest.h>

#include <vector>

#include "core/resident_plan.h"

namespace torch_uvm {
namespace {

using V = std::vector<bool>;

// One piece per unit, of the given sizes.
std::vector<std::vector<int>> own(std::size_t n) {
  std::vector<std::vector<int>> units;
  for (std::size_t i = 0; i < n; ++i) units.push_back({static_cast<int>(i)});
  return units;
}

V plan(const std::vector<std::size_t>& sizes, std::size_t budget, Window w,
       ResidentAt at = ResidentAt::kStart) {
  return plan_resident(own(sizes.size()), sizes, budget, w, at).resident;
}

TEST(ResidentPlan, TheResidentPrefixOrSuffixIsWhatFitsBesideTheWindowInOrder) {
  const Window none{0, 0}, two{2, 0};
  EXPECT_EQ(plan({4, 4, 4}, 12, two), (V{true, true, true}));    // all fit: no window
  EXPECT_EQ(plan({4, 4, 4}, 11, none), (V{true, true, false}));
  EXPECT_EQ(plan({4, 4, 4}, 11, {0, 0}, ResidentAt::kEnd), (V{false, true, true}));
  EXPECT_EQ(plan({4, 8, 1}, 11, none), (V{true, false, false}));  // a prefix, no gaps
  EXPECT_EQ(plan({1, 8, 4}, 11, none, ResidentAt::kEnd), (V{false, false, true}));
  EXPECT_EQ(plan({4, 4, 4, 4}, 15, two), (V{true, false, false, false}));  // 8 for the window
  EXPECT_EQ(plan({4, 4}, 7, two), (V{false, false}));              // no room beside it
  EXPECT_EQ(plan_resident(own(2), {4, 4}, 7, two, ResidentAt::kStart).window_bytes, 7u);
  EXPECT_EQ(plan({}, 0, two), V{});
  const ResidentPlan p = plan_resident(own(4), {4, 4, 4, 4}, 15, two, ResidentAt::kStart);
  EXPECT_EQ(p.resident_bytes, 4u);
  EXPECT_EQ(p.window_bytes, 8u);
}

TEST(ResidentPlan, TheWindowIsSizedByTheLargestUnitThatStreams) {
  // A large unit at the resident end: kept, the rest streams through a
  // window of two small ones (2 x 2), where sizing it by the large one
  // (2 x 10) would leave no room at all.
  const std::vector<std::size_t> sizes{2, 2, 2, 2, 10};
  const ResidentPlan p = plan_resident(own(5), sizes, 17, {2, 0}, ResidentAt::kEnd);
  EXPECT_EQ(p.resident, (V{false, false, false, true, true}));
  EXPECT_EQ(p.resident_bytes, 12u);
  EXPECT_EQ(p.window_bytes, 4u);
  // At the start the large one comes last: it streams, the window is its
  // size (2 x 10), and little fits beside it.
  EXPECT_EQ(plan(sizes, 17, {2, 0}), V(5, false));
  const std::vector<std::size_t> eight{2, 2, 2, 2, 2, 2, 2, 2, 10};
  EXPECT_EQ(plan(eight, 24, {2, 0}), (V{true, true, false, false, false, false, false, false,
                                         false}));
  EXPECT_EQ(plan_resident(own(9), eight, 24, {2, 0}, ResidentAt::kEnd).resident_bytes, 20u);
  // `step_bytes`: what a step brings beside (gradients, states) comes beside
  // everything, the resident units too (here a step of the largest unit, 6).
  const std::vector<std::size_t> more{2, 2, 2, 2, 2, 2, 6};
  EXPECT_EQ(plan(more, 17, {2, 0}, ResidentAt::kEnd),
            (V{false, false, false, true, true, true, true}));
  const ResidentPlan step = plan_resident(own(7), more, 17, {2, 6}, ResidentAt::kEnd);
  EXPECT_EQ(step.resident, (V{false, false, false, false, false, false, true}));
  EXPECT_EQ(step.window_bytes, 10u);  // 2 x 2 + 1 x 6
  // Everything fits, but a step needs room beside it: not all resident
  // until the budget holds the weights and a step of the largest unit.
  EXPECT_EQ(plan({4, 4, 4}, 12, {2, 4}), V(3, false));
  const ResidentPlan all = plan_resident(own(3), {4, 4, 4}, 16, {2, 4}, ResidentAt::kStart);
  EXPECT_EQ(all.resident, V(3, true));
  EXPECT_EQ(all.window_bytes, 4u);
  // A frozen model's step brings nothing: all of it fits in its weights' bytes.
  EXPECT_EQ(plan({4, 4, 4}, 12, {2, 0}), V(3, true));
}

TEST(ResidentPlan, ATiedPieceCountsOnceAndStreamsWithNoUnitWhenResident) {
  // GPT-2's shape: an embedding (piece 0) whose weight the last unit (the
  // head) shares, and layers between them.
  const std::vector<std::vector<int>> units{{0}, {1}, {2}, {3}, {0, 4}};
  const std::vector<std::size_t> bytes{10, 2, 2, 2, 1};
  // At the end: the head brings the embedding's piece; the embedding then
  // streams nothing, so the window is two layers' (2 x 2), not 2 x 11.
  ResidentPlan p = plan_resident(units, bytes, 16, {2, 0}, ResidentAt::kEnd);
  EXPECT_EQ(p.resident, (V{false, false, false, false, true}));
  EXPECT_EQ(p.resident_bytes, 11u);
  EXPECT_EQ(p.window_bytes, 4u);
  // what each brings when it runs: the embedding nothing, the head nothing
  EXPECT_EQ(p.stream_bytes, (std::vector<std::size_t>{0, 2, 2, 2, 0}));
  EXPECT_EQ(p.largest_streamed, 2u);
  // Everything fits when the tied piece counts once (17 bytes).
  EXPECT_EQ(plan_resident(units, bytes, 17, {2, 0}, ResidentAt::kEnd).resident, V(5, true));
  // At the start: the embedding resident; the head then streams its bias
  // alone, within the two layers' window.
  p = plan_resident(units, bytes, 16, {2, 0}, ResidentAt::kStart);
  EXPECT_EQ(p.resident, (V{true, true, false, false, false}));
  EXPECT_EQ(p.resident_bytes, 12u);
  EXPECT_EQ(p.window_bytes, 4u);
  // A streamed unit shrinks once a resident one holds its tied piece: the
  // head (10 tied + 6) streams 6, so the window is 2 x 6, not 2 x 16, and
  // four layers stay beside the embedding (22 bytes resident, not 13).
  const std::vector<std::vector<int>> eight{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {0, 9}};
  const std::vector<std::size_t> sized{10, 3, 3, 3, 3, 3, 3, 3, 3, 6};
  p = plan_resident(eight, sized, 34, {2, 0}, ResidentAt::kStart);
  EXPECT_EQ(p.resident_bytes, 22u);
  EXPECT_EQ(p.window_bytes, 12u);
}

}  // namespace
}  // namespace torch_uvm
