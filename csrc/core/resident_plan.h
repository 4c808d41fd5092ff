// What stays on the GPU when a module streams under a budget: which of an
// offloaded module's units (submodules) are resident, and the window the
// rest streams through. Policy only, tested on the host; the executor
// (torch/stream_executor.h) carries the plan out.
#pragma once

#include <cstddef>
#include <vector>

namespace torch_uvm {

// Where the resident units sit in the order in which units run.
// kStart: a backward ends on them, and the first units of a pass compute
// while the first streamed ones arrive (training). kEnd: the streamed units
// run first, so the host issues their slow kernels (waiting on the link)
// ahead of the GPU, and the resident rest runs at the GPU's speed while the
// link brings the next pass's first units; a pass that ends in a host wait
// (a generated token) then costs the larger of the two times, not their
// sum (inference).
enum class ResidentAt { kStart, kEnd };

// What the window beside the resident units must hold: `per_streamed` of
// the largest streamed unit (the one running and those brought ahead), and
// `step_bytes` beside everything, resident or not (what a unit's optimizer
// step makes and brings beside its weights: the gradients and states of its
// largest trainable part; none for a frozen model).
struct Window {
  std::size_t per_streamed = 0;
  std::size_t step_bytes = 0;
};

struct ResidentPlan {
  std::vector<bool> resident;     // per unit, in the order given
  std::size_t resident_bytes = 0; // each piece once
  std::size_t window_bytes = 0;   // what streaming needs beside them
  // Per unit, the bytes it brings when it runs: its pieces no resident
  // unit holds (0 for a resident one); and the largest of them.
  std::vector<std::size_t> stream_bytes;
  std::size_t largest_streamed = 0;
};

// `units[i]`: the pieces (tensors) unit i holds, by index into
// `piece_bytes`; a piece shared by units (a tied weight) is resident when
// any resident unit holds it, and crosses the link only with a unit that
// is not. The resident units are the longest run at `at` (no gaps) that
// fits the budget beside its window; the window is sized by the largest
// unit that then streams (its pieces not resident), so a plan that keeps a
// large unit resident streams through a smaller window. Everything is
// resident when all of it fits beside a step's room. When no run fits, nothing is resident and the window is
// the whole budget. O(units x pieces) per run length.
ResidentPlan plan_resident(const std::vector<std::vector<int>>& units,
                           const std::vector<std::size_t>& piece_bytes, std::size_t budget,
                           Window window, ResidentAt at = ResidentAt::kStart);

}  // namespace torch_uvm
