// Steps in backward under way and the one throttle on them
// (core/steps_behind.h), on the host runtime, whose events complete when the
// test says.
#include <gtest/gtest.h>

#include <memory>

#include "core/steps_behind.h"
#include "runtime/host_runtime.h"

namespace torch_uvm {
namespace {

struct Steps {
  HostRuntime rt;
  StreamRef stream;
  int waited = 0;
  StepsBehind steps;

  Steps()
      : stream(rt.create_stream(0)), steps(rt, [this] {
          ++waited;
          return std::shared_ptr<void>();
        }) {
    rt.set_auto_complete_events(false);
  }
};

TEST(StepsBehind, WaitsForTheOldestBeyondTheLimit) {
  Steps s;
  for (int k = 0; k < 5; ++k) {
    s.steps.queued(s.stream);
    s.steps.at_most(2);
  }
  // 3 > 2 at the third, fourth and fifth: one wait each, the oldest
  EXPECT_EQ(s.waited, 3);
  EXPECT_EQ(s.steps.waits(), 3u);
  EXPECT_EQ(s.steps.under_way(), 2u);
  EXPECT_EQ(s.rt.counters().event_syncs, 3u);
}

TEST(StepsBehind, StepsThatRanLeaveWithoutAWait) {
  Steps s;
  for (int k = 0; k < 4; ++k) s.steps.queued(s.stream);
  EXPECT_EQ(s.steps.under_way(), 4u);
  s.rt.complete_events();
  EXPECT_EQ(s.steps.under_way(), 0u);
  s.steps.queued(s.stream);
  s.steps.at_most(1);
  EXPECT_EQ(s.waited, 0);
  EXPECT_EQ(s.steps.under_way(), 1u);
}

TEST(StepsBehind, TheNewestStaysUnderWay) {
  Steps s;
  for (int k = 0; k < 3; ++k) s.steps.queued(s.stream);
  s.steps.at_most(0);  // counts as 1: the step just queued is not waited for
  EXPECT_EQ(s.waited, 2);
  EXPECT_EQ(s.steps.under_way(), 1u);
}

}  // namespace
}  // namespace torch_uvm
