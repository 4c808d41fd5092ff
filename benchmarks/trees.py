"""One tree against another: the same benchmark variants run from an older
torch_uvm and from this one, interleaved in one run, as ratios with their
spread (new over old, higher is better).

    python benchmarks/trees.py --make-old REV DIR
        (here, with git: DIR gets REV's torch_uvm/, csrc/, include/ and
        setup.py, and this tree's benchmarks/, so the benchmarks are the
        same and only torch_uvm differs)
    (cd DIR && python setup.py build_ext --inplace)     (on the GPU machine)
    python benchmarks/trees.py --old DIR [--rounds 3] [--cases ...] --out OUT

Each case is SCRIPT:SCENARIO/VARIANT of a benchmark that runs one variant
per process (`--scenario S --variant V`, printing a RESULT line): by
default the MLP under 1 GiB (offload_train mlp, the step after backward and
in backward), GPT-2 1.2B under 4 GiB (offload_train gpt2, in backward) and
generation of a 3 GiB model under 1.5 GiB (offload_generate, auto mode).
Every round runs each case from both trees, the order of the two rotated
each round, each in a fresh process. A ratio pairs the two runs of one
round. Before round 1, --warmup runs (default 1) of the first case from this
tree are made and not counted: a call's first benchmark process can run
slow (a GPT-2 host step at 0.47 s against 0.32-0.34 s after it), and
would land on whichever tree runs first.

The physical limit of each case is its own benchmark's (the least any
placement moves over the link, at the pinned rate measured with it); here
both trees run the same placement on the same machine, so the ratio itself
is the figure: 1.0 is unchanged. Beside each, the process's GPU memory
(mem_get_info) and the host's peak of each tree's runs. Writes trees.json
and trees.png to OUT.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import method  # noqa: E402

CASES = ["offload_train:mlp/torch_uvm", "offload_train:mlp/torch_uvm_in_backward",
         "offload_train:gpt2/torch_uvm_in_backward", "offload_generate:generate/torch_uvm_offload"]


def make_old(rev: str, out: str) -> None:
    """`out` gets `rev`'s torch_uvm package and its native module's sources,
    and this tree's benchmarks."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    archive = subprocess.run(["git", "archive", rev, "torch_uvm", "csrc", "include", "setup.py"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    shutil.copytree(HERE, os.path.join(out, "benchmarks"),
                    ignore=shutil.ignore_patterns("results", "__pycache__"))
    with open(os.path.join(out, "REV"), "w") as f:
        f.write(subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout)
    print(f"{out}: torch_uvm/, csrc/, include/ and setup.py of {rev}, benchmarks/ of this tree; "
          f"build its native module there (python setup.py build_ext --inplace)")


def figure(result: dict) -> tuple:
    """(value, higher is better, its name) of a case's RESULT: for results
    by batch (offload_lora, offload_llama), the largest batch's."""
    if result.get("batches"):
        return figure(max(result["batches"].items(), key=lambda kv: int(kv[0]))[1])
    if result.get("tokens_per_s") is not None:
        return result["tokens_per_s"], True, "tokens/s"
    if result.get("tokens_per_step"):
        return result["tokens_per_step"] / result["s_per_step"], True, "tokens/s"
    return 1.0 / result["s_per_step"], True, "steps/s"


def outcome(result: dict):
    """What both trees must compute alike: a run's losses or tokens (per
    batch where it reports by batch); None where it reports neither."""
    if result.get("batches"):
        return {b: outcome(r) for b, r in result["batches"].items()}
    return result.get("losses", result.get("tokens"))


def process_gpu_memory(result: dict):
    """The process's GPU memory over a run, as offload_train records it, or
    from the peak offload_lora and offload_llama record (the same measure:
    mem_get_info against the free bytes after CUDA's start); None if neither."""
    if result.get("process_gpu_memory"):
        return result["process_gpu_memory"]
    peak = result.get("gpu_peak_run_bytes")
    return None if peak is None else {"peak_bytes": peak}


def run_case(tree: str, case: str, timeout: int):
    script, rest = case.split(":")
    scenario, variant = rest.split("/")
    return method.spawn(os.path.join(tree, "benchmarks", script + ".py"), timeout=timeout,
                        scenario=scenario, variant=variant)


def report(cases, runs, rates, old_rev, rounds, out, warmup=()):
    """The table, trees.json and trees.png of the rounds so far."""
    trees = ("old", "new")
    rows, compared = {}, {}
    for case in cases:
        values = {t: [figure(x)[0] if x else None for x in runs[case][t]] for t in trees}
        ok = next((x for t in trees for x in runs[case][t] if x), None)
        unit = figure(ok)[2] if ok else "?"
        compared[case] = method.ratio(values["new"], values["old"], lower_is_better=False)
        rows[case] = {
            "unit": unit,
            **{t: method.summarize([v for v in values[t] if v is not None]) for t in trees},
            "process_gpu_memory": {t: method.gpu_memory_cell(
                [process_gpu_memory(x) for x in runs[case][t] if x]) for t in trees},
            "host_peak_gib": {t: max([x.get("host_peak_bytes") or 0 for x in runs[case][t] if x]
                                     or [0]) / 2**30 for t in trees},
            "losses_equal": all(
                a is not None and b is not None and outcome(a) == outcome(b)
                for a, b in zip(runs[case]["old"], runs[case]["new"])),
        }
    print(f"\nold: torch_uvm/ of {old_rev[:10]}; new: this tree; {rounds} rounds, "
          f"pinned rate {method.summarize([x['h2d_gbps'] for x in rates if x and 'h2d_gbps' in x])}")
    print("| case | old | new | new / old (min–max) | GPU memory old / new | host peak old / new | "
          "same losses |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        row, c = rows[case], compared[case]
        cell = (lambda s: "failed" if not s else f"{s['median']:.3g} {row['unit']}")
        ratio = "—" if not c else f"{c['median']:.3f} ({c['min']:.3f}–{c['max']:.3f})"
        print(f"| {case} | {cell(row['old'])} | {cell(row['new'])} | {ratio} | "
              f"{row['process_gpu_memory']['old']} / {row['process_gpu_memory']['new']} | "
              f"{row['host_peak_gib']['old']:.1f} / {row['host_peak_gib']['new']:.1f} GiB | "
              f"{row['losses_equal']} |")
    os.makedirs(out, exist_ok=True)
    method.write(os.path.join(out, "trees.json"), compared, old_rev=old_rev, rows=rows,
                 runs=runs, pinned_rates=rates, rounds=rounds, warmup=list(warmup))
    plt = method.pyplot()
    if plt is not None:
        names = [c for c in cases if compared[c]]
        med, err = method.error_bars([compared[c] for c in names])
        fig, ax = plt.subplots(figsize=(8, 3 + 0.4 * len(names)))
        ax.barh(range(len(names)), med, xerr=err)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(range(len(names)), names)
        ax.set_xlabel(f"new / old (higher is better; old = {old_rev[:10]})")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "trees.png"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make-old", nargs=2, metavar=("REV", "DIR"))
    ap.add_argument("--old")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=1,
                    help="runs of the first case from this tree before round 1, not counted")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    if args.make_old:
        make_old(*args.make_old)
        return
    if not args.old:
        ap.error("--old DIR (made by --make-old) or --make-old REV DIR")
    if not glob.glob(os.path.join(args.old, "torch_uvm", "_C*.so")):
        ap.error(f"{args.old} has no native module: build it there first "
                 f"(python setup.py build_ext --inplace)")
    with open(os.path.join(args.old, "REV")) as f:
        old_rev = f.read().strip()
    trees = {"old": os.path.abspath(args.old), "new": ROOT}
    cases = args.cases.split(",")
    runs = {c: {"old": [], "new": []} for c in cases}
    rates = []
    t0 = time.time()
    warmup = []
    for _ in range(args.warmup):
        warmup.append(run_case(trees["new"], cases[0], args.timeout))
        print(f"warm-up: {cases[0]} from this tree (not counted): "
              f"{figure(warmup[-1])[0] if warmup[-1] else 'failed'}", flush=True)
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        rates.append(method.pinned_rate())
        import torch
        torch.cuda.empty_cache()   # (the cases' processes have the GPU to themselves)
        for k, case in enumerate(cases):
            order = ["old", "new"] if (r + k) % 2 == 0 else ["new", "old"]
            for t in order:
                runs[case][t].append(run_case(trees[t], case, args.timeout))
            print(f"    {case}: done", flush=True)
        report(cases, runs, rates, old_rev, r + 1, args.out, warmup)   # (a run cut short keeps its rounds)
    print(f"{len(cases)} cases x 2 trees x {args.rounds} rounds in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
