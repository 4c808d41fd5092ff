#include "core/resident_plan.h"

#include <algorithm>

namespace torch_uvm {
namespace {

// A unit's bytes not yet counted in `taken` (shared pieces once).
std::size_t new_bytes(const std::vector<int>& pieces, const std::vector<std::size_t>& bytes,
                      const std::vector<bool>& taken) {
  std::size_t sum = 0;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const int p = pieces[k];
    if (taken[p] || std::find(pieces.begin(), pieces.begin() + k, p) != pieces.begin() + k) {
      continue;  // resident already, or listed twice
    }
    sum += bytes[p];
  }
  return sum;
}

}  // namespace

ResidentPlan plan_resident(const std::vector<std::vector<int>>& units,
                           const std::vector<std::size_t>& piece_bytes, std::size_t budget,
                           Window window, ResidentAt at) {
  const std::size_t n = units.size();
  // A step's gradients and states come beside everything, streamed or not.
  const std::size_t step = window.step_bytes;
  auto index = [&](std::size_t k) { return at == ResidentAt::kStart ? k : n - 1 - k; };
  // The first k units at `at` resident, for each k: the rest streams
  // through a window sized by the largest of them once the resident ones'
  // pieces are counted. Resident bytes never fall as k grows, so the
  // longest run that fits wins.
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t best = kNone, best_bytes = 0, best_window = 0;
  std::vector<bool> taken(piece_bytes.size(), false);
  std::size_t resident = 0;
  for (std::size_t k = 0; k <= n; ++k) {
    if (k > 0) {
      const auto& u = units[index(k - 1)];
      resident += new_bytes(u, piece_bytes, taken);
      for (int p : u) taken[p] = true;
    }
    std::size_t streamed = 0;
    for (std::size_t j = k; j < n; ++j) {
      streamed = std::max(streamed, new_bytes(units[index(j)], piece_bytes, taken));
    }
    const std::size_t need = (streamed > 0 ? window.per_streamed * streamed : 0) + step;
    if (resident + need > budget) continue;
    best = k;  // later runs keep as many bytes or more: the longest that fits wins
    best_bytes = resident;
    best_window = need;
  }
  ResidentPlan plan;
  plan.resident.assign(n, false);
  plan.window_bytes = budget;  // none fits: the budget streams
  if (best != kNone) {
    for (std::size_t j = 0; j < best; ++j) plan.resident[index(j)] = true;
    plan.resident_bytes = best_bytes;
    plan.window_bytes = best_window;
  }
  std::fill(taken.begin(), taken.end(), false);
  for (std::size_t i = 0; i < n; ++i) {
    if (plan.resident[i]) {
      for (int p : units[i]) taken[p] = true;
    }
  }
  for (const auto& u : units) {
    plan.stream_bytes.push_back(new_bytes(u, piece_bytes, taken));
    plan.largest_streamed = std::max(plan.largest_streamed, plan.stream_bytes.back());
  }
  return plan;
}

}  // namespace torch_uvm
