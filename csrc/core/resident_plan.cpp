#include "core/resident_plan.h"

#include <algorithm>
#include <functional>

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
  const std::vector<bool> none(piece_bytes.size(), false);
  std::vector<bool> used(piece_bytes.size(), false);
  std::size_t total = 0, largest = 0;
  std::vector<std::size_t> sizes;  // each unit's own bytes: the window candidates
  for (const auto& u : units) {
    total += new_bytes(u, piece_bytes, used);
    for (int p : u) used[p] = true;
    sizes.push_back(new_bytes(u, piece_bytes, none));
    largest = std::max(largest, sizes.back());
  }
  if (total <= budget) return {std::vector<bool>(n, true), total, 0};

  ResidentPlan best{std::vector<bool>(n, false), 0, 0};
  bool found = false;
  sizes.push_back(0);
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // Each candidate bounds the largest streamed unit: it sizes the window,
  // the rest of the budget takes resident units in order, and the plan
  // holds if nothing larger is left to stream.
  for (std::size_t bound : sizes) {
    const std::size_t need = window.per_streamed * bound + window.per_any * largest;
    if (need > budget) continue;
    std::size_t room = budget - need;
    ResidentPlan plan{std::vector<bool>(n, false), 0, need};
    std::vector<bool> taken(piece_bytes.size(), false);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = at == ResidentAt::kStart ? k : n - 1 - k;
      const std::size_t more = new_bytes(units[i], piece_bytes, taken);
      if (more > room) break;  // no gaps: the rest streams
      room -= more;
      plan.resident_bytes += more;
      plan.resident[i] = true;
      for (int p : units[i]) taken[p] = true;
    }
    std::size_t streamed = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!plan.resident[i]) streamed = std::max(streamed, new_bytes(units[i], piece_bytes, taken));
    }
    if (streamed > bound) continue;  // the window would not hold it
    if (!found || plan.resident_bytes > best.resident_bytes) best = std::move(plan);
    found = true;
  }
  if (!found) best.window_bytes = budget;  // nothing resident: the whole budget streams
  return best;
}

}  // namespace torch_uvm
