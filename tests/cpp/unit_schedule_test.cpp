// When an offload's units come and go (core/unit_schedule.h), on the CPU:
// the shapes of passes that broke before on a GPU, and a randomized
// sequence of passes through a glue that carries the schedule out on a
// residency budget, checking after every event that the GPU never holds more
// than the budget, that what holds a unit is what the schedule says, and
// that nothing is held after a training pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/errors.h"
#include "core/unit_schedule.h"

namespace torch_uvm {
namespace {

constexpr std::size_t kMiB = 1 << 20;

// The torch glue's part, as StreamExecutor plays it: each unit one range of
// the budget's share, held while it runs or is brought ahead.
struct Glue {
  ResidencyBudget budget;
  ShareId share = 0;
  std::vector<std::size_t> bytes;
  std::vector<int> holds;  // per unit: runs and brings ahead holding it
  std::unique_ptr<UnitSchedule> s;
  std::vector<std::pair<int, bool>> brought_ahead;  // (unit, beyond), in order
  std::size_t step_units = 0;

  Glue(std::vector<std::size_t> unit_bytes, std::size_t limit, int ahead, bool training,
       bool in_place = false, std::vector<std::size_t> trainable = {})
      : bytes(std::move(unit_bytes)), holds(bytes.size(), 0) {
    budget.set_limit(0, limit);
    share = budget.open_share(0, limit, "test", limit);
    s = std::make_unique<UnitSchedule>(budget, share, ahead, in_place, training);
    trainable.resize(bytes.size(), 0);
    for (std::size_t t : trainable) s->add_unit(t);
  }
  static std::uintptr_t key(int unit) { return 0x1000 * (unit + 1); }

  bool admit(int unit, bool required) {
    for (bool again = false;; again = true) {
      try {
        budget.admit(0, key(unit), bytes[unit], false, share);
        return true;
      } catch (const InvalidArgument&) {
        if (!required) return false;
        if (again) throw;
        release(s->let_go_of_what_can_wait());
      }
    }
  }
  void hold(int unit) {
    if (holds[unit]++ == 0) budget.set_busy(key(unit), true);
  }
  void release(const std::vector<int>& units) {
    for (int u : units) {
      ASSERT_GT(holds[u], 0) << "unit " << u << " released without a hold";
      if (--holds[u] == 0 && !pinned(u)) budget.set_busy(key(u), false);
    }
  }
  bool pinned(int unit) const { return s->planned() && s->resident(unit); }

  void before(int unit, bool backward, bool grad = true) {
    const UnitSchedule::Begin b = s->begins(unit, backward, grad);
    release(b.let_go);
    if (b.arrival == UnitSchedule::Arrival::kAgain ||
        b.arrival == UnitSchedule::Arrival::kInPlace) {
      return;
    }
    if (b.arrival == UnitSchedule::Arrival::kOnDemand) {
      admit(unit, true);
      hold(unit);
      s->held(unit);
    }
    s->bring_ahead(unit, backward, [&](int next, bool beyond) {
      const ResidencyStats st = budget.share_stats(share);
      // beyond the window: only into room nothing holds, nothing leaves
      if (beyond && st.resident_bytes + st.leaving_bytes + bytes[next] > st.limit) return false;
      if (!admit(next, false)) return false;
      hold(next);
      brought_ahead.emplace_back(next, beyond);
      return true;
    });
  }
  void after(int unit) {
    if (s->ends(unit)) release({unit});
  }
  void end_pass() { release(s->end_pass()); }
  // The first forward runs on demand, in `order`; then the plan.
  // (`grad`: it builds a graph, so it is on the next backward's route)
  void first_forward_and_plan(const std::vector<int>& order, const std::vector<bool>& resident,
                              std::size_t step = 0, bool grad = true) {
    for (int u : order) {
      before(u, false, grad);
      after(u);
    }
    end_pass();
    const std::vector<int> pass = s->pass_order();
    std::vector<bool> res;
    std::vector<std::size_t> stream;
    std::size_t largest = 0;
    for (int u : pass) {
      res.push_back(resident[u]);
      stream.push_back(resident[u] ? 0 : bytes[u]);
      if (!resident[u]) largest = std::max(largest, bytes[u]);
    }
    for (int u : pass) {
      if (!resident[u]) continue;
      admit(u, true);
      budget.set_busy(key(u), true);
    }
    step_units = step;
    s->plan(pass, res, stream, largest, step);
  }
  std::vector<int> ahead_units() const {
    std::vector<int> out;
    for (const auto& [u, beyond] : brought_ahead) out.push_back(u);
    return out;
  }
};

TEST(UnitSchedule, AForwardBringsAheadWithinItsWindowInBytes) {
  // ahead 1: the window is twice the largest streamed unit (4 MiB)
  Glue g({2 * kMiB, kMiB, kMiB, 2 * kMiB, kMiB}, 64 * kMiB, 1, false);
  g.first_forward_and_plan({0, 1, 2, 3, 4}, {false, false, false, false, false});
  EXPECT_EQ(g.s->window_bytes(), 4 * kMiB);
  g.brought_ahead.clear();
  g.before(0, false);
  // beside unit 0 (2 MiB): 1 and 2 (1 MiB each) fit the 2 MiB left; 3 does not
  EXPECT_EQ(g.ahead_units(), (std::vector<int>{1, 2}));
  g.after(0);
  g.brought_ahead.clear();
  g.before(1, false);  // staged: its holds pass to this run
  EXPECT_STREQ(g.s->holds(1), "running");
  EXPECT_STREQ(g.s->holds(2), "brought ahead");
  EXPECT_EQ(g.ahead_units(), (std::vector<int>{3}));
}

TEST(UnitSchedule, ABackwardRetracesTheForwardThatBuiltItsGraph) {
  // a routed expert: the forward ran 0, 2, 3 (not 1); its backward brings 2
  // then 0 ahead of 3, never 1
  Glue g({kMiB, kMiB, kMiB, kMiB}, 64 * kMiB, 2, true);
  g.first_forward_and_plan({0, 1, 2, 3}, {false, false, false, false}, 0, /*grad=*/false);
  for (int u : {0, 2, 3}) {
    g.before(u, false);
    g.after(u);
  }
  g.end_pass();  // (a training forward's end lets go of what it brought ahead)
  g.brought_ahead.clear();
  g.before(3, true);
  EXPECT_EQ(g.ahead_units(), (std::vector<int>{2, 0}));
  g.after(3);
  g.end_pass();
  for (int u = 0; u < 4; ++u) EXPECT_EQ(g.holds[u], 0) << u;
}

TEST(UnitSchedule, UnitsBroughtAheadThatThePassWentPastAreLetGo) {
  // a branch not taken: 1 was brought ahead, the forward went on to 2 (a
  // budget of the window alone: nothing beyond it)
  Glue g({kMiB, kMiB, kMiB, kMiB}, 2 * kMiB, 1, true);
  g.first_forward_and_plan({0, 1, 2, 3}, {false, false, false, false});
  g.before(0, false);
  g.after(0);
  EXPECT_EQ(g.s->staged(), (std::vector<int>{1}));
  g.before(2, false);
  EXPECT_EQ(g.holds[1], 0);
  EXPECT_EQ(g.s->holds(1), nullptr);
  g.after(2);
  g.end_pass();
}

TEST(UnitSchedule, InferenceWrapsRoundAndTrainingLetsGoAtAPassEnd) {
  for (bool training : {false, true}) {
    Glue g({kMiB, kMiB, kMiB}, 64 * kMiB, 1, training);
    g.first_forward_and_plan({0, 1, 2}, {false, false, false});
    for (int u : {0, 1, 2}) {
      g.before(u, false, /*grad=*/training);
      g.after(u);
    }
    g.end_pass();
    if (training) {
      EXPECT_TRUE(g.s->staged().empty());
      EXPECT_EQ(g.holds[0], 0);
    } else {  // the last unit brought the next forward's first
      EXPECT_EQ(g.s->staged(), (std::vector<int>{0}));
      EXPECT_EQ(g.holds[0], 1);
    }
  }
}

TEST(UnitSchedule, AResidentUnitBringsTheWholeWindowAhead) {
  Glue g({4 * kMiB, kMiB, kMiB, kMiB, kMiB}, 6 * kMiB, 1, true);  // nothing beyond it
  g.first_forward_and_plan({0, 1, 2, 3, 4}, {true, false, false, false, false});
  EXPECT_EQ(g.s->window_bytes(), 2 * kMiB);
  g.brought_ahead.clear();
  g.before(0, false);
  EXPECT_EQ(g.ahead_units(), (std::vector<int>{1, 2}));  // a resident unit streams nothing
  g.after(0);
  g.end_pass();
}

TEST(UnitSchedule, ABusyHomeStopsTheBringAheadAndIsRefusedOnDemand) {
  Glue g({kMiB, kMiB, kMiB, kMiB}, 64 * kMiB, 3, true);
  g.first_forward_and_plan({0, 1, 2, 3}, {false, false, false, false});
  g.s->set_home_busy(2, true);
  g.brought_ahead.clear();
  g.before(0, false);
  EXPECT_EQ(g.ahead_units(), (std::vector<int>{1}));  // stops at 2: 3 comes after it
  g.after(0);
  EXPECT_THROW(g.s->begins(2, false, true), InvalidArgument);
  // refused before anything changed: unit 1, brought ahead, still held as such
  EXPECT_FALSE(g.s->running(2));
  EXPECT_STREQ(g.s->holds(1), "brought ahead");
  g.s->check();
  g.s->set_home_busy(2, false);
  g.end_pass();
}

TEST(UnitSchedule, AForwardRecomputedInsideABackwardBringsNothingAhead) {
  Glue g({kMiB, kMiB, kMiB}, 64 * kMiB, 2, true);
  g.first_forward_and_plan({0, 1, 2}, {false, false, false});
  for (int u : {0, 1, 2}) {
    g.before(u, false);
    g.after(u);
  }
  g.before(2, true);
  g.after(2);
  g.brought_ahead.clear();
  g.before(1, false);  // activation checkpointing recomputes unit 1's forward
  EXPECT_TRUE(g.ahead_units().empty());
  g.after(1);
  g.end_pass();
}

TEST(UnitSchedule, WhatCanWaitIsBroughtAheadOrInBackward) {
  Glue g({kMiB, kMiB, kMiB, kMiB}, 64 * kMiB, 2, true);
  g.first_forward_and_plan({0, 1, 2, 3}, {false, false, false, false});
  for (int u : {0, 1, 2, 3}) {
    g.before(u, false);
    g.after(u);
  }
  g.before(3, true);  // holds 3, brings 2 and 1 ahead, and 0 beyond the window
  std::vector<int> let_go = g.s->let_go_of_what_can_wait();
  std::sort(let_go.begin(), let_go.end());
  EXPECT_EQ(let_go, (std::vector<int>{0, 1, 2, 3}));
  g.release(let_go);
  EXPECT_FALSE(g.s->ends(3));  // its hold is gone already
  g.end_pass();
}

TEST(UnitSchedule, BadInputIsRefused) {
  ResidencyBudget b;
  EXPECT_THROW(UnitSchedule(b, 0, 0, false, true), InvalidArgument);
  UnitSchedule s(b, 0, 1, false, true);
  s.add_unit(0);
  s.add_unit(0);
  EXPECT_THROW(s.begins(2, false, true), InvalidArgument);
  EXPECT_THROW(s.plan({0}, {false}, {1}, 1, 0), InvalidArgument);
  EXPECT_THROW(s.plan({0, 0}, {false, false}, {1, 1}, 1, 0), InvalidArgument);
  s.plan({1, 0}, {false, false}, {1, 1}, 1, 0);
  EXPECT_THROW(s.set_training(false), InvalidArgument);
  EXPECT_THROW(s.set_in_place(true), InvalidArgument);
}

// Random passes, as users write them: forwards that skip units (a branch,
// an expert), call one twice, or run without a graph; backwards over
// the forwards since the last one, with recomputed forwards inside and
// host steps busy on units behind them; a bring that must happen letting go
// of what can wait. After every event: the schedule's own invariants, the
// share within its budget, every unit held exactly as the schedule says,
// and beyond the window, the backward's step room kept.
TEST(UnitSchedule, RandomPassesKeepEveryInvariant) {
  std::mt19937 rng(2026);
  auto chance = [&](double p) { return std::uniform_real_distribution<>(0, 1)(rng) < p; };
  for (int round = 0; round < 300; ++round) {
    const int n = 2 + static_cast<int>(rng() % 9);
    const int ahead = 1 + static_cast<int>(rng() % 3);
    const bool training = chance(0.7);
    std::vector<std::size_t> bytes, trainable;
    std::vector<bool> resident;
    std::size_t resident_bytes = 0, largest = 0, largest_trainable = 0;
    for (int u = 0; u < n; ++u) {
      bytes.push_back((1 + rng() % 8) * kMiB);
      trainable.push_back(chance(0.3) ? 0 : bytes.back());
      resident.push_back(chance(0.25));
      if (resident.back()) resident_bytes += bytes.back();
      else largest = std::max(largest, bytes.back());
      largest_trainable = std::max(largest_trainable, trainable.back());
    }
    const std::size_t step_units = training ? rng() % 3 : 0;
    const std::size_t limit = resident_bytes + (ahead + 1) * largest +
                              step_units * largest_trainable + (rng() % 16) * kMiB;
    Glue g(bytes, std::max(limit, 16 * kMiB), ahead, training, false, trainable);
    std::vector<int> first(n);
    for (int u = 0; u < n; ++u) first[u] = u;
    std::shuffle(first.begin(), first.end(), rng);
    g.first_forward_and_plan(first, resident, step_units);
    const std::vector<int> order = g.s->order();

    auto check = [&](const char* event, int unit) {
      SCOPED_TRACE(::testing::Message() << "round " << round << ", " << event << " " << unit);
      g.s->check();
      const ResidencyStats st = g.budget.share_stats(g.share);
      ASSERT_LE(st.resident_bytes + st.leaving_bytes, st.limit) << "over the budget";
      for (int u = 0; u < n; ++u) {
        if (g.pinned(u)) continue;
        ASSERT_LE(g.holds[u], 1) << "unit " << u << " held twice";
        ASSERT_EQ(g.holds[u] == 1, g.s->holds(u) != nullptr)
            << "unit " << u << ": held " << g.holds[u] << ", the schedule says "
            << (g.s->holds(u) ? g.s->holds(u) : "free");
      }
    };
    for (int pass = 0; pass < 6; ++pass) {
      // forwards: the plan's order, skipping some units, calling some twice
      std::vector<int> ran;
      const int forwards = training ? 1 + static_cast<int>(rng() % 2) : 1;
      const bool grad = training && chance(0.85);
      for (int f = 0; f < forwards; ++f) {
        for (int u : order) {
          if (chance(0.15)) continue;
          g.brought_ahead.clear();
          g.before(u, false, grad);
          check("forward", u);
          std::size_t within = 0;
          for (const auto& [v, beyond] : g.brought_ahead) {
            if (!beyond) within += bytes[v];
          }
          if (!g.brought_ahead.empty()) {
            ASSERT_LE(within, std::max(g.s->window_bytes(), bytes[g.brought_ahead[0].first]))
                << "round " << round << ": brought ahead past the window";
          }
          if (chance(0.1)) {  // called twice (a GAN's discriminator)
            g.before(u, false, grad);
            g.after(u);
          }
          g.after(u);
          check("forward end", u);
          ran.push_back(u);
        }
      }
      if (training && grad && !ran.empty()) {
        g.end_pass();  // the forward's end
        check("forward's pass end", -1);
        std::vector<int> route;  // each unit at its last run, in reverse
        for (auto it = ran.rbegin(); it != ran.rend(); ++it) {
          if (std::find(route.begin(), route.end(), *it) == route.end()) route.push_back(*it);
        }
        std::vector<int> busy;
        for (int u : route) {
          if (trainable[u] == 0 && chance(0.5)) continue;  // autograd skips a frozen unit
          g.brought_ahead.clear();
          if (g.s->home_busy(u)) continue;  // (its host step: it is not run again)
          g.before(u, true);
          check("backward", u);
          for (const auto& [v, beyond] : g.brought_ahead) {
            if (!beyond) continue;
            const ResidencyStats st = g.budget.share_stats(g.share);
            ASSERT_LE(st.resident_bytes + g.step_units * trainable[u], st.limit)
                << "round " << round << ": beyond the window into the step room";
          }
          if (chance(0.2)) {  // activation checkpointing recomputes its forward
            g.before(u, false);
            g.after(u);
          }
          if (chance(0.1)) {  // a bring that must happen finds the budget held
            g.release(g.s->let_go_of_what_can_wait());
            check("let go", u);
          }
          g.after(u);
          check("backward end", u);
          // a host step writes its homes from now until the step
          if (chance(0.2) && std::find(g.s->staged().begin(), g.s->staged().end(), u) ==
                                 g.s->staged().end()) {
            g.s->set_home_busy(u, true);
            busy.push_back(u);
          }
        }
        g.end_pass();
        check("backward's pass end", -1);
        for (int u = 0; u < n; ++u) {
          ASSERT_TRUE(g.pinned(u) || g.holds[u] == 0)
              << "round " << round << ": unit " << u << " held after a training pass";
        }
        for (int u : busy) g.s->set_home_busy(u, false);  // optimizer.step()
      } else {
        g.end_pass();
        check("pass end", -1);
      }
    }
  }
}

}  // namespace
}  // namespace torch_uvm
