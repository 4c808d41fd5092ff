"""Break the code a GPU test guards and check that the test fails.

    python3 scripts/mutants.py [--out DIR] [NAME ...]

Each mutant below replaces one piece of the torch glue, rebuilds the
extension (ninja recompiles the one file; a Python mutant needs none), runs
the tests that guard it and expects them to fail. The source is restored, and the extension rebuilt,
whatever happens. Run it on the GPU machine after a build
(scripts/gpu_session.sh build); it prints a table and exits non-zero if a
mutant survives.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIES = "tests/python/test_gpu_copies.py::"
OFFLOAD = "tests/python/test_gpu_offload.py::"

# (name, file, text, replacement, tests that must fail)
MUTANTS = [
    ("copy to a GPU does not prefetch its source", "csrc/torch/copy_kernels.cpp",
     "    schedule_prefetch(ptr, bytes, to_index(target), stream, /*off_thread=*/false);\n", "",
     [COPIES + "test_copy_to_gpu_prefetches_the_managed_source",
      COPIES + "test_load_state_dict_from_managed_cpu_tensors"]),
    ("a blocking copy to a GPU does not wait", "csrc/torch/copy_kernels.cpp",
     "  if (!non_blocking) c10::cuda::getCurrentCUDAStream(target.index()).synchronize();\n", "",
     [COPIES + "test_a_blocking_copy_is_done_when_it_returns"]),
    ("overlapping copies take the fast path", "csrc/torch/copy_kernels.cpp",
     "  return x < y + nb && y < x + na;", "  return false;",
     [COPIES + "test_copies_over_memory_the_destination_shares_are_pytorchs"]),
    ("no 4 MiB floor", "csrc/torch/copy_kernels.cpp",
     "constexpr std::size_t kFastCopyMinBytes = 4u << 20;",
     "constexpr std::size_t kFastCopyMinBytes = 1;",
     [COPIES + "test_load_state_dict_from_managed_cpu_tensors",
      COPIES + "test_small_and_unmanaged_copies_to_cpu_are_pytorchs"]),
    ("the budget is ignored by copies", "csrc/torch/copy_kernels.cpp",
     "  if (!residency_budget().limit(self.device().index()).has_value()) return true;\n",
     "  return true;\n",
     [COPIES + "test_under_a_budget_a_cpu_homed_destination_is_not_prefetched_into"]),
    ("every CPU-homed destination is refused", "csrc/torch/copy_kernels.cpp",
     "  if (!residency_budget().limit(self.device().index()).has_value()) return true;\n", "",
     [COPIES + "test_a_moved_cpu_tensor_is_a_destination_like_any_other",
      COPIES + "test_load_state_dict_from_managed_cpu_tensors"]),
    ("copies to the CPU are not staged", "csrc/torch/copy_kernels.cpp",
     "  if (stages(self, src)) {", "  if (false && stages(self, src)) {",
     [COPIES + "test_copy_to_managed_cpu_goes_through_pinned_buffers"]),
    ("undo drops the limit another offload streams under", "torch_uvm/residency.py",
     "            if heir is None:\n", "            if True:\n",
     [OFFLOAD + "test_undoing_one_of_two_offloads_keeps_the_limit_for_the_other"]),
    ("a limit below a live offload's budget is taken", "torch_uvm/residency.py",
     "    if not misfits():\n        return\n", "    return\n",
     [OFFLOAD + "test_a_limit_an_offload_would_not_stream_under_is_refused"]),
    ("a dropped offload keeps what it held", "torch_uvm/offload.py",
     "weakref.finalize(self, _ENDED.append, self._lease)",
     "weakref.finalize(self, len, self._lease)",
     [OFFLOAD + "test_an_offload_dropped_without_undo_gives_back_what_it_held"]),
    ("gradient hooks hold the offload strongly", "torch_uvm/offload_training.py",
     "lambda p, ref=ref, i=i: _on_grad(ref, i, p)",
     "lambda p, h=handle, i=i: grad_ready(h, h.units[i], p)",
     [OFFLOAD + "test_an_offload_dropped_without_undo_gives_back_what_it_held"]),
    ("offload does not collect a dropped offload before refusing", "torch_uvm/offload.py",
     "        _collect_dropped_offloads()   # a limit set by one", "        pass  # a limit set by one",
     [OFFLOAD + "test_an_offload_dropped_without_undo_gives_back_what_it_held"]),
    ("residency_limit_mb is not applied in C++", "csrc/torch/state.cpp",
     "b->set_limit(d, limit);", "(void)b;",
     [OFFLOAD + "test_environment_keys_for_larger_than_gpu"]),
]


def build():
    return subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="substrings of mutant names (default: all)")
    parser.add_argument("--out", default=None, help="folder for the log of each mutant")
    args = parser.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    chosen = [m for m in MUTANTS if not args.names or any(n in m[0] for n in args.names)]
    rows, survived = [], 0
    try:
        survived = run_all(chosen, args.out, rows)
    finally:   # whatever happened, the extension is built from the source again
        restored = build()
    print("\n| mutant | outcome |\n|---|---|")
    for name, outcome, _ in rows:
        print(f"| {name} | {outcome} |")
    print(f"\n{len(rows) - survived} of {len(rows)} killed; extension rebuilt from the "
          f"original source: rc={restored.returncode}")
    return 1 if survived or restored.returncode else 0


def run_all(chosen, out, rows):
    survived = 0
    for name, path, text, replacement, tests in chosen:
        full = os.path.join(ROOT, path)
        original = open(full).read()
        if original.count(text) != 1:
            rows.append((name, "text not found once: fix the mutant", 0))
            survived += 1
            continue
        # a killed run leaves the mutant on disk: `git checkout -- <file>` undoes it
        t0 = time.time()
        try:
            open(full, "w").write(original.replace(text, replacement))
            made = build()
            if made.returncode != 0:
                outcome = "did not build"
                log = made.stdout
            else:
                ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                                      "no:cacheprovider", *tests], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                log = ran.stdout
                outcome = "killed" if ran.returncode == 1 else \
                    "SURVIVED" if ran.returncode == 0 else f"pytest rc={ran.returncode}"
        finally:
            open(full, "w").write(original)
        survived += outcome != "killed"
        rows.append((name, outcome, time.time() - t0))
        print(f"{outcome:>10}  {name}  ({time.time() - t0:.0f} s)", flush=True)
        if out:
            slug = "".join(c if c.isalnum() else "_" for c in name)[:60]
            with open(os.path.join(out, f"mutant_{slug}.log"), "w") as f:
                f.write(log)
    return survived


if __name__ == "__main__":
    sys.exit(main())
