// The offload's training lifecycle (core/unit_lifecycle.h) on the CPU: each
// shape that broke before on a GPU, a randomized sequence of passes checking
// the invariants after every event, and gradients from several threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/unit_lifecycle.h"

namespace torch_uvm {
namespace {

std::vector<std::string> names(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back("u" + std::to_string(i));
  return out;
}

// A lifecycle whose units expect so many gradients each.
struct Life : UnitLifecycle {
  explicit Life(const std::vector<int>& expected) : UnitLifecycle(names(expected.size())) {
    for (std::size_t i = 0; i < expected.size(); ++i) set_expected(int(i), expected[i]);
  }
};

TEST(UnitLifecycle, AUnitsGradientsCompleteOnceItsLastCameAndItStepsOnce) {
  Life life({2, 1});
  auto b = life.backward_begins(1, false);
  EXPECT_TRUE(b.opened);
  EXPECT_TRUE(b.released.empty());
  EXPECT_EQ(life.state(1), UnitState::kBackward);
  EXPECT_TRUE(life.gradient(1, 7));
  EXPECT_EQ(life.state(1), UnitState::kGradientsDone);
  EXPECT_FALSE(life.backward_begins(0, false).opened);
  EXPECT_FALSE(life.gradient(0, 7));
  EXPECT_EQ(life.state(0), UnitState::kGradients);
  EXPECT_TRUE(life.gradient(0, 7));
  life.check();
  EXPECT_TRUE(life.end_backward().empty());
  EXPECT_FALSE(life.backward_active());
  life.stepped(0, false);
  life.stepped(1, false);
  EXPECT_TRUE(life.stepped_in_backward().empty());  // stepped in optimizer.step()
  life.check();
  EXPECT_EQ(life.step_ends(), (std::vector<int>{0, 1}));
  EXPECT_EQ(life.state(0), UnitState::kIdle);
  life.check();
}

TEST(UnitLifecycle, GradientsCountPerBackwardWhetherOrNotTheUnitsBackwardBegan) {
  // A tied weight whose owner did not run, a regularizer over a unit's
  // parameters: its gradients come with no backward of its own.
  Life life({2});
  life.backward_begins(0, false);
  EXPECT_FALSE(life.gradient(0, 1));
  life.end_backward();  // (it came in part: sent home)
  // The next backward's count starts from none, not from the one left.
  life.backward_begins(0, false);
  EXPECT_FALSE(life.gradient(0, 2));
  EXPECT_TRUE(life.gradient(0, 2));
  life.end_backward();
  // A gradient before the unit's own backward began still counts when it does.
  Life two({2, 1});
  two.backward_begins(1, false);
  EXPECT_FALSE(two.gradient(0, 4));  // (a regularizer over unit 0, first)
  two.backward_begins(0, false);
  EXPECT_TRUE(two.gradient(0, 4));
  EXPECT_TRUE(two.end_backward().empty());
  Life tied({1, 1});
  tied.backward_begins(1, false);
  EXPECT_TRUE(tied.gradient(0, 3));  // unit 0's backward never began
  EXPECT_TRUE(tied.gradient(1, 3));
  EXPECT_TRUE(tied.end_backward().empty());
  tied.check();
}

TEST(UnitLifecycle, AFrozenUnitIsLetGoOfWhenTheNextUnitsBackwardBegins) {
  Life life({1, 0, 0, 1});
  life.backward_begins(3, false);
  EXPECT_TRUE(life.backward_begins(2, false).released.empty());
  EXPECT_EQ(life.backward_begins(1, false).released, (std::vector<int>{2}));
  EXPECT_EQ(life.backward_begins(0, false).released, (std::vector<int>{1}));
  life.check();
  life.end_backward();
  life.check();  // nothing held after the pass
  // A frozen unit is not released twice: the next backward starts clean.
  EXPECT_TRUE(life.backward_begins(0, false).released.empty());
}

TEST(UnitLifecycle, GradientsThatCameInPartAreReturnedAtTheBackwardsEndOnce) {
  Life life({3, 2, 1});
  life.backward_begins(0, false);
  life.gradient(0, 5);
  life.gradient(1, 5);
  life.gradient(1, 5);
  EXPECT_EQ(life.end_backward(), (std::vector<int>{0}));
  EXPECT_EQ(life.state(0), UnitState::kGradientsDone);
  EXPECT_EQ(life.state(2), UnitState::kIdle);  // none came: nothing to send
  life.check();
  EXPECT_TRUE(life.end_backward().empty());  // (a second end finds nothing)
}

TEST(UnitLifecycle, AccumulationCountsEachBackwardAnewAndStepsOnce) {
  Life life({2});
  for (int task = 1; task <= 3; ++task) {
    life.backward_begins(0, false);
    EXPECT_FALSE(life.gradient(0, task));
    EXPECT_TRUE(life.gradient(0, task));
    life.end_backward();
    life.check();
  }
  life.stepped(0, false);
  EXPECT_EQ(life.step_ends(), std::vector<int>{0});
}

TEST(UnitLifecycle, StepInBackwardRefusesASecondBackwardBeforeTheStep) {
  Life life({1});
  life.backward_begins(0, true);
  ASSERT_TRUE(life.gradient(0, 1));
  life.steps_in_backward(0);
  life.stepped(0, true);
  EXPECT_EQ(life.stepped_in_backward(), std::vector<int>{0});
  life.end_backward();
  try {
    life.backward_begins(0, true);
    FAIL() << "a second backward was let through";
  } catch (const OrderError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.step() after every backward"),
              std::string::npos);
  }
  EXPECT_FALSE(life.backward_active());  // refused before anything changed
  life.check();
  life.step_ends();
  EXPECT_TRUE(life.backward_begins(0, true).opened);
  // Without step_in_backward nothing stepped in backward: accumulation is fine.
  Life acc({1});
  acc.backward_begins(0, false);
  acc.end_backward();
  EXPECT_TRUE(acc.backward_begins(0, false).opened);
}

TEST(UnitLifecycle, AUnitWhoseGradientsComeTwiceInOneBackwardIsRefusedItsSecondStep) {
  // Reentrant checkpointing: each segment's backward is a graph task of its own.
  Life life({1});
  life.backward_begins(0, true);
  ASSERT_TRUE(life.gradient(0, 1));
  life.steps_in_backward(0);
  life.stepped(0, true);
  ASSERT_TRUE(life.gradient(0, 2));
  EXPECT_EQ(life.state(0), UnitState::kStepped);
  try {
    life.steps_in_backward(0);
    FAIL() << "a second step in one backward was let through";
  } catch (const OrderError& e) {
    EXPECT_NE(std::string(e.what()).find("'u0'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("use_reentrant=False"), std::string::npos);
  }
}

TEST(UnitLifecycle, ANestedBackwardsGradientsCountApartFromTheOneItIsIn) {
  // A reentrant checkpoint's segment runs its backward as a graph task of
  // its own, inside the outer one: its gradients complete on their own.
  Life life({2});
  life.backward_begins(0, false);
  EXPECT_FALSE(life.gradient(0, 1));  // the outer backward's first
  EXPECT_FALSE(life.gradient(0, 2));  // the nested one's first
  EXPECT_TRUE(life.gradient(0, 2));
  life.check();
}

TEST(UnitLifecycle, FewerTrainableParametersNeverCompleteOnACountFromBefore) {
  Life life({3});
  life.backward_begins(0, false);
  life.gradient(0, 1);
  life.gradient(0, 1);
  life.set_expected(0, 2);  // unfrozen to frozen between two gradients
  life.check();
  EXPECT_FALSE(life.gradient(0, 1));
  EXPECT_TRUE(life.gradient(0, 1));
  EXPECT_THROW(life.set_expected(0, -1), InvalidArgument);
  EXPECT_THROW(life.gradient(9, 1), InvalidArgument);
}

TEST(UnitLifecycle, HostUnitsAreThoseChosenAtTheBackwardsOpening) {
  Life life({1, 1, 1});
  life.set_host_units({0, 2});
  EXPECT_TRUE(life.on_host(0));
  EXPECT_FALSE(life.on_host(1));
  life.set_host_units({1});
  EXPECT_FALSE(life.on_host(0));
  EXPECT_TRUE(life.on_host(1));
  // A unit about to step in backward learns where in the same call.
  EXPECT_TRUE(life.steps_in_backward(1));
  EXPECT_FALSE(life.steps_in_backward(2));
}

// Random passes as users write them: forwards that freeze and unfreeze,
// backwards whose units run in any order, with gradients that come early
// (tied), late, twice (reentrant) or not at all (an unused branch), step in
// backward or not, accumulation. After every event the invariants hold;
// after every backward each unit's gradients went home (or stepped) exactly
// once; after every step each unit stepped at most once.
TEST(UnitLifecycle, RandomPassesKeepEveryInvariant) {
  std::mt19937 rng(20261128);
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  for (int round = 0; round < 300; ++round) {
    const int n = 1 + pick(8);
    std::vector<int> expected(n);
    for (int& e : expected) e = pick(4);
    Life life(expected);
    const bool in_backward = pick(2) == 1;
    std::int64_t task = 0;
    std::vector<int> steps(n, 0);  // per unit, since the last step's end
    for (int step = 0; step < 4; ++step) {
      if (pick(3) == 0) {  // a forward that builds a graph follows requires_grad
        const int i = pick(n);
        expected[i] = pick(4);
        life.set_expected(i, expected[i]);
        life.check();
      }
      const int backwards = in_backward ? 1 : 1 + pick(2);
      for (int b = 0; b < backwards; ++b) {
        ++task;
        std::vector<int> home(n, 0);  // gradients sent home or stepped, this backward
        std::vector<int> deliveries;
        for (int i = 0; i < n; ++i) {
          const int came = pick(5) == 0 ? pick(expected[i] + 1) : expected[i];
          for (int k = 0; k < came; ++k) deliveries.push_back(i);
        }
        std::shuffle(deliveries.begin(), deliveries.end(), rng);
        std::vector<int> order(n);
        for (int i = 0; i < n; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        auto deliver = [&](int i) {  // one gradient of unit i
          if (life.gradient(i, task)) {
            ++home[i];
            if (in_backward) {
              life.steps_in_backward(i);
              life.stepped(i, true);
              ++steps[i];
            }
          }
          life.check();
        };
        std::size_t next = 0;
        for (int u : order) {
          life.backward_begins(u, in_backward);
          life.check();
          for (int k = pick(3); k > 0 && next < deliveries.size(); --k) deliver(deliveries[next++]);
        }
        while (next < deliveries.size()) deliver(deliveries[next++]);
        for (int i : life.end_backward()) ++home[i];
        life.check();
        ASSERT_FALSE(life.backward_active());
        for (int i = 0; i < n; ++i) {
          const int came = static_cast<int>(std::count(deliveries.begin(), deliveries.end(), i));
          ASSERT_EQ(home[i], came > 0 ? 1 : 0) << "unit " << i << " round " << round;
        }
      }
      // optimizer.step(): every unit that did not step in backward steps now.
      for (int i = 0; i < n; ++i) {
        if (!life.has_stepped(i) && expected[i] > 0) {
          life.stepped(i, false);
          ++steps[i];
        }
        ASSERT_LE(steps[i], 1) << "unit " << i << " stepped twice, round " << round;
      }
      life.step_ends();
      std::fill(steps.begin(), steps.end(), 0);
      life.check();
      for (int i = 0; i < n; ++i) ASSERT_EQ(life.state(i), UnitState::kIdle);
    }
  }
}

TEST(UnitLifecycle, GradientsFromSeveralThreadsCompleteEachUnitOnce) {
  // Autograd's device threads deliver gradients while the caller's thread
  // asks what stepped: one lock keeps the counts whole (TSan checks it).
  const int units = 16, per_unit = 64, threads = 4;
  Life life(std::vector<int>(units, per_unit));
  life.backward_begins(0, false);
  std::atomic<int> complete{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int u = 0; u < units; ++u) {
        for (int k = t; k < per_unit; k += threads) {
          if (life.gradient(u, 1)) complete.fetch_add(1);
        }
      }
    });
  }
  pool.emplace_back([&] {
    for (int k = 0; k < 200; ++k) (void)life.stepped_in_backward(), (void)life.has_stepped(k % units);
  });
  for (auto& th : pool) th.join();
  EXPECT_EQ(complete.load(), units);
  EXPECT_TRUE(life.end_backward().empty());
  life.check();
}

}  // namespace
}  // namespace torch_uvm
