"""Runs every benchmark side by side and prints the tables.

    python benchmarks/run.py [--out benchmarks/results] [--only alloc,train,...]
    python benchmarks/run.py --replot results.json --out DIR   # plots only

Each round runs one fresh process per allocator (workloads.py), which runs
that allocator's workloads in a fixed order, and the allocators one after
another, --rounds times (benchmarks/method.py). The C++ allocation
benchmark runs in its own process. The tables show the median of the
rounds; the ratios pair the runs of one round and give their median and
min-max, against issue 12's targets. Writes results.json (with the machine
and the "comparisons" that benchmarks/compare.py reads), results.md and plots
(PNG) to --out. Needs a GPU.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import method  # noqa: E402
OPTIONAL = {"rmm": "rmm", "cupy": "cupy"}     # anchor -> the package it needs
PLAN = {
    "alloc": ["torch", "torch_uvm", "raw_managed", "cupy", "rmm"],
    # The same pairs from C++ (benchmarks/cpp/alloc_bench.cpp; BENCH_CPP names
    # its build folder): no Python in the loop.
    "alloc_cpp": ["torch", "torch_uvm", "torch_uvm_direct", "raw_managed"],
    "train": ["torch", "torch_uvm", "raw_managed", "rmm"],
    # torch_uvm as shipped (prefetch issued by a worker thread), and on the
    # caller's thread (the first version, and the naive advise+prefetch).
    # Pieces issued one after another (prefetch_chunk_mb:16/64) or by 2 and 4
    # threads at once were slower (H100, 2026-11-22; the results file that
    # commit 2fcb90c added).
    "moves_to_gpu": ["torch", "torch_uvm", "torch_uvm:async_prefetch:false"],
    "moves_to_cpu": ["torch", "torch_uvm"],
    # copies between GPU and CPU tensors: pinned/pageable (UVM off) against
    # managed CPU tensors with and without torch_uvm's fast copies
    "copies": ["torch", "torch_uvm"],
    "faults": ["torch_uvm"],
    # small copies between GPU tensors: what the allocator's lock costs a copy
    "small_copies": ["torch", "torch_uvm"],
    # Which segment unit suits managed memory: torch_uvm under several
    # small/large segment sizes (PYTORCH_UVM_ALLOC_CONF), training steps.
    "segments": ["torch_uvm:small_segment_mb:2,large_segment_mb:20",
                 "torch_uvm:small_segment_mb:8,large_segment_mb:20",
                 "torch_uvm:small_segment_mb:2,large_segment_mb:64",
                 "torch_uvm:small_segment_mb:32,large_segment_mb:128"],
}
MiB = 1 << 20


def human(n):
    n = int(n)
    return f"{n // MiB} MiB" if n >= MiB else (f"{n // 1024} KiB" if n >= 1024 else f"{n} B")


def run_one(allocator, workload):
    """`workload` (or several, comma-separated: one process runs them in
    order) with `allocator` in a fresh process: {workload: result}, or None
    when the process failed."""
    t0 = time.time()
    print(f"  running {workload} with {allocator} ...", flush=True)
    env = dict(os.environ)
    if ":" in allocator:  # "torch_uvm:<PYTORCH_UVM_ALLOC_CONF>"
        allocator, env["PYTORCH_UVM_ALLOC_CONF"] = allocator.split(":", 1)
    if workload == "alloc_cpp":
        cmd = [os.path.join(os.environ.get("BENCH_CPP", "build-bench"), "alloc_bench"), allocator]
    else:
        cmd = [sys.executable, os.path.join(HERE, "workloads.py"), allocator, workload]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"  FAILED {workload}/{allocator}: {e}", flush=True)
        return None
    if p.returncode != 0:
        print(f"  FAILED {workload}/{allocator}:\n{p.stderr[-2000:]}", flush=True)
        return None
    lines = [json.loads(l) for l in p.stdout.strip().splitlines() if l.startswith("{")]
    each = ", ".join(f"{l['workload']} {l['seconds']} s" for l in lines if "seconds" in l)
    print(f"  done in {time.time() - t0:.0f} s" + (f" ({each})" if each else ""), flush=True)
    return {line.get("workload", workload): line["result"] for line in lines}


def run_group(allocator, workloads):
    """Every workload of one round that uses `allocator`: the Python ones in
    one fresh process (process start and CUDA init cost about 8 s, which
    five rounds of a process per workload could not afford in 10 minutes),
    the C++ one in its own. {workload: result or None}."""
    out = {}
    python = [w for w in workloads if w != "alloc_cpp"]
    for part in (["alloc_cpp"] if "alloc_cpp" in workloads else []) + \
            ([",".join(python)] if python else []):
        out.update(run_one(allocator, part) or {})
    return {w: out.get(w) for w in workloads}


def table(title, header, rows):
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def alloc_table(a, plan, title):
    peers = [p for p in plan if a.get(p)]
    rows = []
    for key in a["torch"]:
        label = "mixed trace, per alloc" if not key.isdigit() else human(key)
        base = a["torch"][key]
        rows.append([label] + [f"{a[p][key]:.2f} µs ({a[p][key] / base:.2f}×)"
                               if key in a[p] else "n/a" for p in peers])
    return table(f"{title} (median µs, ratio to PyTorch)", ["size"] + peers, rows)


def merged(results, workload):
    """{size: {method: numbers}} over every allocator of a workload."""
    out = {}
    for per_size in filter(None, results.get(workload, {}).values()):
        for size, methods in per_size.items():
            out.setdefault(size, {}).update(methods)
    return out


def report(results):
    out = []
    for key, title in (("alloc", "1. Allocation: torch.empty + del from Python"),
                       ("alloc_cpp", "1b. Allocation: alloc + free from C++")):
        a = results.get(key, {})
        if a.get("torch"):
            out.append(alloc_table(a, PLAN[key], title))
    t = results.get("train", {})
    if t.get("torch"):
        peers = [p for p in PLAN["train"] if t.get(p)]
        rows = [[m] + [f"{t[p][m]:.2f} ms ({t[p][m] / t['torch'][m]:.2f}×)" for p in peers]
                for m in t["torch"]]
        out.append(table("2. Training step (median ms, ratio to UVM off)", ["model"] + peers, rows))
    g = merged(results, "moves_to_gpu")
    if g:
        rows = []
        for size, methods in g.items():
            pinned = methods["pinned_copy"]
            for name, v in methods.items():
                sleeping = v.get("ready_sleeping_ms")
                rows.append([human(size), name, f"{v['call_ms']:.3f}", f"{v['ready_ms']:.3f}",
                             f"{v['call_ms'] / pinned['ready_ms'] * 100:.1f}%",
                             f"{v['ready_ms'] / pinned['ready_ms']:.2f}×",
                             f"{sleeping:.3f} ({sleeping / pinned['ready_sleeping_ms']:.2f}×)"
                             if sleeping else "n/a"])
        out.append(table("3. Moves to the GPU (host-resident source)",
                         ["size", "method", "call ms", "data ready ms", "call / pinned",
                          "ready / pinned", "ready ms, host asleep (/ pinned)"], rows))
    c = merged(results, "moves_to_cpu")
    if c:
        rows = []
        for size, methods in c.items():
            for name, v in methods.items():
                rows.append([human(size), name, f"{v['ms']:.2f}", f"{v['GBps']:.1f}"])
        out.append(table("4. Moves to the CPU, then a CPU read of all data",
                         ["size", "method", "ms", "GB/s"], rows))
    cp = merged(results, "copies")
    if cp:
        rows = []
        for size, methods in cp.items():
            for name, v in sorted(methods.items()):
                rows.append([human(size), name, f"{v['ms']:.2f}", f"{v['GBps']:.1f}"])
        out.append(table("4b. Copies between the GPU and CPU tensors (blocking)",
                         ["size", "direction, method", "ms", "GB/s"], rows))
    sc = merged(results, "small_copies")
    if sc:
        rows = [[human(size), name, f"{v['call_us']:.2f}", f"{v['burst_us_per_copy']:.2f}"]
                for size, methods in sc.items() for name, v in methods.items()]
        out.append(table("4c. Small copies between GPU tensors, one device",
                         ["size", "allocator", "µs per call (host)", "µs per copy, 1000 then sync"],
                         rows))
    f = results.get("faults", {}).get("torch_uvm")
    if f:
        rows = [[k, f"{v['ms']:.2f}", f"{v['GBps']:.1f}"] for k, v in f.items()]
        out.append(table("5. First kernel over 512 MiB of host-resident managed data",
                         ["mode", "ms", "GB/s"], rows))
    seg = results.get("segments", {})
    if seg:
        rows = []
        for conf, v in seg.items():
            if v:
                rows.append([conf.split(":", 1)[1]] + [f"{v[m]['ms']:.2f} ms, peak reserved "
                                                       f"{v[m]['peak_reserved'] / MiB:.0f} MiB"
                                                       for m in ("mlp", "transformer")])
        out.append(table("6. Segment units: training step time and peak reserved memory",
                         ["PYTORCH_UVM_ALLOC_CONF", "mlp", "transformer"], rows))
    return "\n".join(out)


def plot(results, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots")
        return
    a = results.get("alloc", {})
    if a.get("torch"):
        fig, ax = plt.subplots(figsize=(7, 4))
        keys = [k for k in a["torch"] if k.isdigit()]
        for peer in PLAN["alloc"]:
            if a.get(peer):
                ax.plot([human(k) for k in keys], [a[peer][k] for k in keys], marker="o", label=peer)
        ax.set_yscale("log")
        ax.set_ylabel("µs per torch.empty + del (median)")
        ax.set_title("Allocation cost")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "alloc.png"))
    g = merged(results, "moves_to_gpu")
    if g:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(dict.fromkeys(n for per in g.values() for n in per))
        for name in names:          # an anchor may skip sizes (pageable_copy)
            sizes = [s for s in g if name in g[s]]
            ax.plot([human(s) for s in sizes], [g[s][name]["ready_ms"] for s in sizes],
                    marker="o", label=f"{name} (ready)")
            ax.plot([human(s) for s in sizes], [g[s][name]["call_ms"] for s in sizes],
                    marker="x", linestyle=":", label=f"{name} (call)")
        ax.set_yscale("log")
        ax.set_ylabel("ms: call returns (dotted), kernel has read the data")
        ax.set_title("Moves to the GPU")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "moves_to_gpu.png"))
    for workload, key, ylabel, title in (
            ("moves_to_cpu", "GBps", "GB/s, then a CPU read", "Moves and copies to the CPU"),
            ("small_copies", "call_us", "µs per copy_ call (host)", "Small copies between GPU tensors")):
        m = merged(results, workload)
        if not m:
            continue
        fig, ax = plt.subplots(figsize=(8, 4))
        names = list(dict.fromkeys(n for per in m.values() for n in per))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            sizes = [s for s in m if name in m[s]]
            ax.bar([list(m).index(s) + i * width for s in sizes],
                   [m[s][name][key] for s in sizes], width, label=name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(m))], [human(s) for s in m])
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{workload}.png"))
    c = merged(results, "copies")
    if c:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = sorted(dict.fromkeys(n for per in c.values() for n in per))
        for name in names:
            sizes = [s for s in c if name in c[s]]
            ax.plot([human(s) for s in sizes], [c[s][name]["GBps"] for s in sizes],
                    marker="o", linestyle="-" if name.startswith("to_gpu") else "--", label=name)
        ax.set_ylabel("GB/s (blocking copy)")
        ax.set_title("Copies between the GPU and CPU tensors")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "copies.png"))


def median_result(results):
    """Leaf-wise median of one variant's runs (nested dicts of numbers)."""
    results = [r for r in results if r is not None]
    if not results:
        return None
    if not isinstance(results[0], dict):
        return statistics.median(results)
    return {k: median_result([r.get(k) for r in results]) for k in results[0]}


def leaf(runs, *path):
    """The value at `path` in each round's run (None where missing)."""
    out = []
    for r in runs or []:
        for key in path:
            r = r.get(key) if isinstance(r, dict) else None
        out.append(r)
    return out


def comparisons(runs):
    """Issue 12's ratios, round by round, with their targets."""
    out = {}
    for workload, target in (("alloc", 1.05), ("alloc_cpp", 1.05)):
        a = runs.get(workload, {})
        base = next((r for r in a.get("torch", []) if r), None)
        for key in base or {}:
            label = "mixed trace" if not key.isdigit() else human(key)
            for peer in PLAN[workload]:
                if peer != "torch" and a.get(peer):
                    out[f"{workload} {label}: {peer} / torch"] = method.ratio(
                        leaf(a[peer], key), leaf(a["torch"], key),
                        target=target if peer.startswith("torch_uvm") else None)
    t = runs.get("train", {})
    for model in next((r for r in t.get("torch", []) if r), {}) or {}:
        for peer in PLAN["train"]:
            if peer != "torch" and t.get(peer):
                out[f"train {model}: {peer} / torch"] = method.ratio(
                    leaf(t[peer], model), leaf(t["torch"], model),
                    target=1.03 if peer == "torch_uvm" else None)
    g = runs.get("moves_to_gpu", {})
    for size in next((r for r in g.get("torch", []) if r), {}) or {}:
        pinned = leaf(g["torch"], size, "pinned_copy", "ready_ms")
        for allocator in PLAN["moves_to_gpu"][1:]:
            for name in next((r[size] for r in g.get(allocator, []) if r), {}):
                out[f"moves_to_gpu {human(size)}: {name} data ready / pinned copy"] = method.ratio(
                    leaf(g[allocator], size, name, "ready_ms"), pinned, target=1.1)
                # a blocking move may hold the caller; a non-blocking one may not
                out[f"moves_to_gpu {human(size)}: {name} call / pinned data ready"] = method.ratio(
                    leaf(g[allocator], size, name, "call_ms"), pinned,
                    target=0.05 if name == "torch_uvm" else None)
    c = runs.get("moves_to_cpu", {})
    for size in next((r for r in c.get("torch_uvm", []) if r), {}) or {}:
        gbps = leaf(c["torch_uvm"], size, "torch_uvm", "GBps")
        out[f"moves_to_cpu {human(size)}: torch_uvm GB/s, then a CPU read"] = method.ratio(
            gbps, [1.0] * len(gbps), target=20, lower_is_better=False)
        for name in ("torch_uvm .to('cpu', copy=True)",
                     "torch_uvm .to('cpu', copy=True, non_blocking=True)"):
            gbps = leaf(c["torch_uvm"], size, name, "GBps")
            if any(g is not None for g in gbps):
                out[f"moves_to_cpu {human(size)}: {name} GB/s, then a CPU read"] = method.ratio(
                    gbps, [1.0] * len(gbps), target=30, lower_is_better=False)
    sc = runs.get("small_copies", {})
    for size in next((r for r in sc.get("torch_uvm", []) if r), {}) or {}:
        for what in ("call_us", "burst_us_per_copy"):
            out[f"small_copies {human(size)}: torch_uvm / PyTorch, {what}"] = method.ratio(
                leaf(sc["torch_uvm"], size, "torch_uvm", what),
                leaf(sc.get("torch"), size, "torch", what),
                target=1.1)
    cp = runs.get("copies", {})
    for size in next((r for r in cp.get("torch_uvm", []) if r), {}) or {}:
        if int(size) < 64 * MiB:
            continue          # the target is for 64 MiB - 1 GiB
        for way in ("to_gpu", "to_cpu"):
            out[f"copies {human(size)} {way}: torch_uvm GB/s / pinned copy GB/s"] = method.ratio(
                leaf(cp["torch_uvm"], size, f"{way} torch_uvm", "GBps"),
                leaf(cp["torch"], size, f"{way} pinned_copy", "GBps"),
                target=1.0, lower_is_better=False)
    return out


def main():
    parser = argparse.ArgumentParser()
    # a folder of its own per run: results are kept, dated, never overwritten
    parser.add_argument("--out", default=os.path.join(
        HERE, "results", time.strftime("%Y-%m-%d-%H%M") + "-run"))
    # segments (which segment unit suits managed memory) is asked for by name
    parser.add_argument("--only", default=",".join(w for w in PLAN if w != "segments"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replot", metavar="RESULTS_JSON",
                        help="only draw the plots of an earlier run into --out")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f)["medians"], args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    workloads = args.only.split(",")
    # an anchor whose package is not installed (RMM on the GPU machines) is
    # reported as missing once, not run and failed every round
    missing = {a for w in workloads for a in PLAN[w]
               if a in OPTIONAL and importlib.util.find_spec(OPTIONAL[a]) is None}
    for a in sorted(missing):
        print(f"  {a}: package '{OPTIONAL[a]}' not installed; its rows are left empty")
    allocators = list(dict.fromkeys(a for w in workloads for a in PLAN[w] if a not in missing))
    # A B A B ...: each round, one fresh process per allocator runs its
    # workloads. The files are written after every round, so a run cut short
    # keeps what it measured.
    flat = method.interleaved(
        allocators, args.rounds,
        lambda a: run_group(a, [w for w in workloads if a in PLAN[w]]),
        after_round=lambda done, r: write_all(args, workloads, done, r,
                                              final=r == args.rounds))


def write_all(args, workloads, flat, rounds_done, final):
    runs = {w: {a: [(r or {}).get(w) for r in flat[a]] if a in flat else [None] * rounds_done
                for a in PLAN[w]} for w in workloads}
    results = {w: {a: median_result(rs) for a, rs in per.items()} for w, per in runs.items()}
    compared = comparisons(runs)
    m = method.machine()
    header = (f"GPU: {m.get('gpu')}; driver {m.get('driver')}; torch {m.get('torch')}; "
              f"CUDA {m.get('cuda')}; {m['date']}\n"
              f"Command: python benchmarks/run.py --only {args.only} --rounds {args.rounds}"
              f"{'' if final else f' (cut short: {rounds_done} rounds done)'}\n")
    method.write(os.path.join(args.out, "results.json"), compared, runs=runs, medians=results)
    rows = "\n".join(method.describe(name, summary) for name, summary in compared.items())
    text = (header + "\n" + report(results) + "\n### Ratios, each round's runs paired "
            f"({rounds_done} rounds)\n\n| ratio | median (min–max, n) | target | |\n"
            "|---|---|---|---|\n" + rows + "\n")
    if final:
        print(text)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    if final:
        plot(results, args.out)


if __name__ == "__main__":
    main()
