"""How every benchmark compares (issue 12): variants run interleaved, each
run in a fresh process where the allocator must differ, and a comparison is
the ratio of two variants measured in the same round, reported as the median
with its min-max over the rounds.

A result file (JSON) holds {"machine": {...}, "comparisons": {name: summary}}
where a summary is {"ratios": [...], "median", "min", "max", "target",
"straddles", "lower_is_better"}; benchmarks/compare.py prints the change of
each ratio between two such files.

Honest by construction (issue 36): a link limit is the least that any
placement must move (least_generation_bytes, least_training_limit_s), not
the bytes of our own plan; every run keeps the all-resident variant and
checks outputs against it (outputs_check); and each variant's GPU memory is
the driver's answer for the whole process (ProcessGpuMemory), apart from
any allocator's books.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from floors import ADAMW_HOST_MEMORY, placements


# OFFLOAD_DETERMINISTIC=1: deterministic kernels in every variant (and eager
# attention where a script builds a transformer), so that "losses = all
# resident" can hold bit for bit where PyTorch's defaults accumulate in a
# varying order (SDPA's backward, cuBLAS's split reductions).
DETERMINISTIC = os.environ.get("OFFLOAD_DETERMINISTIC") == "1"


def deterministic_kernels() -> None:
    """Under OFFLOAD_DETERMINISTIC=1, PyTorch's deterministic algorithms
    (an error where an op has none) and cuBLAS's fixed workspace; before CUDA
    starts."""
    if DETERMINISTIC:
        import torch
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def machine() -> dict:
    """The GPU, driver, torch and CUDA a result was measured with."""
    info = {"date": time.strftime("%Y-%m-%d %H:%M")}
    try:
        import torch
        info.update(torch=torch.__version__, cuda=torch.version.cuda,
                    gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except ImportError:
        pass
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        info["driver"] = None
    return info


def interleaved(variants: List[str], rounds: int,
                run: Callable[[str], Optional[dict]],
                after_round: Optional[Callable[[dict, int], None]] = None
                ) -> Dict[str, List[Optional[dict]]]:
    """Runs A B C, B C A, C A B, ... `rounds` times (the order rotated a
    place each round, so a slow first run on a fresh machine lands on each
    variant in turn; ALWAYS's variants, the rate and the reference, stay
    first); result[v][i] is round i's run of v (None when it failed), so
    ratios pair runs of the same round. `after_round(result so far, rounds
    done)` runs after each round."""
    out: Dict[str, List[Optional[dict]]] = {v: [] for v in variants}
    first = [v for v in variants if v.split("/")[-1] in ALWAYS]
    rest = [v for v in variants if v not in first]
    for r in range(rounds):
        print(f"round {r + 1}/{rounds}", flush=True)
        k = r % len(rest) if rest else 0
        for v in first + rest[k:] + rest[:k]:
            out[v].append(run(v))
        if after_round is not None:
            after_round(out, r + 1)
    return out


def summarize(values: List[float]) -> Optional[dict]:
    values = sorted(values)
    if not values:
        return None
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return {"median": median, "min": values[0], "max": values[-1], "n": len(values)}


def ratio(numerators: List[Optional[float]], denominators: List[Optional[float]],
          target: Optional[float] = None, lower_is_better: bool = True) -> Optional[dict]:
    """Round-by-round ratios numerator/denominator, summarized. With a target,
    `straddles` says the spread crosses it (the run cannot tell met from missed)
    and `met` compares the median with it."""
    ratios = [n / d for n, d in zip(numerators, denominators)
              if n is not None and d is not None and d > 0]
    s = summarize(ratios)
    if s is None:
        return None
    s.update(ratios=ratios, target=target, lower_is_better=lower_is_better,
             straddles=target is not None and s["min"] <= target <= s["max"] and
             s["min"] != s["max"])
    if target is not None:
        s["met"] = s["median"] <= target if lower_is_better else s["median"] >= target
    return s


def error_bars(summaries: List[dict]):
    """The medians of summaries (summarize() or ratio() results) and their
    spread as matplotlib's error bars: (medians, [below, above])."""
    med = [s["median"] for s in summaries]
    return med, [[m - s["min"] for s, m in zip(summaries, med)],
                 [s["max"] - m for s, m in zip(summaries, med)]]


def describe(name: str, s: Optional[dict]) -> str:
    """One table row: name, median (min-max), target and whether it is met."""
    if s is None:
        return f"| {name} | failed | | |"
    target = "" if s.get("target") is None else \
        f"{'≤' if s['lower_is_better'] else '≥'} {s['target']:g}"
    verdict = "" if s.get("target") is None else \
        ("spread straddles the target" if s["straddles"] else ("met" if s["met"] else "missed"))
    return (f"| {name} | {s['median']:.3g} ({s['min']:.3g}–{s['max']:.3g}, n={s['n']}) | "
            f"{target} | {verdict} |")


def write(path: str, comparisons: Dict[str, Optional[dict]], **extra) -> None:
    with open(path, "w") as f:
        json.dump({"machine": machine(), "comparisons": comparisons, **extra}, f, indent=1)


def spawn(script: str, timeout: int = 300, **args) -> Optional[dict]:
    """Runs `script --key value ...` in a fresh process and returns the JSON
    of its last "RESULT " line (None, with its output printed, on failure)."""
    import sys
    cmd = [sys.executable, script] + [x for k, v in args.items() for x in (f"--{k}", str(v))]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"    {args} TIMED OUT after {timeout} s", flush=True)
        return None
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        print(f"    {args} FAILED:\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}", flush=True)
        return None
    r = json.loads(line[-1][7:])
    print(f"    {args}: {json.dumps(r)} ({time.time() - t0:.0f} s)", flush=True)
    return r


def scenario_runs(script: str, plan: Dict[str, List[str]], scenarios: List[str], rounds: int,
                  timeout: int = 300) -> Dict[str, Dict[str, List[Optional[dict]]]]:
    """Every variant of `scenarios` run by `script --scenario S --variant V`
    in a fresh process, interleaved over `rounds`:
    {scenario: {variant: [round 1's result, ...]}}."""
    names = [f"{s}/{v}" for s in scenarios for v in plan[s]]
    flat = interleaved(names, rounds, lambda name: spawn(
        script, timeout=timeout, scenario=name.split("/")[0], variant=name.split("/")[1]))
    return {s: {v: flat[f"{s}/{v}"] for v in plan[s]} for s in scenarios}


def driver_args(ap, rounds: int, only: str):
    """The options every benchmark driver takes; returns the parsed args."""
    ap.add_argument("--variant")
    ap.add_argument("--scenario")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--only", default=only)
    ap.add_argument("--variants", default=None,
                    help="run only these variants (comma-separated), e.g. for a quick check")
    return ap


# Kept by --variants in every run: the rate a link limit is computed from,
# and the all-resident run whose outputs every variant is checked against.
ALWAYS = ("pinned_rate", "resident")


def variant_gib(variant: str) -> Optional[float]:
    """The N of a variant name's `_<N>GiB` part (torch_uvm_4GiB_b8,
    torch_uvm_in_backward_3GiB, torch_uvm_0.5GiB: its budget; an int where
    N is whole), or None where it has none."""
    m = re.search(r"_(\d+(?:\.\d+)?)GiB(?:_|$)", variant)
    if not m:
        return None
    n = float(m.group(1))
    return int(n) if n.is_integer() else n


def variant_bound_gib(variant: str) -> Optional[float]:
    """The G of a torch_uvm_bound_<G>GiB... variant (offload(gpu_memory=G
    GiB): a bound on the whole process, not a budget), or None where the
    variant is not one."""
    return variant_gib(variant) if variant.startswith("torch_uvm_bound_") else None


def variant_host_step(variant: str) -> float:
    """The share of a variant name's `_host<S>` part (torch_uvm_in_backward_host1,
    ..._host0.5: stream_optimizer's host_step), or 0 where it has none."""
    m = re.search(r"_host(\d+(?:\.\d+)?)(?:_|$)", variant)
    return float(m.group(1)) if m else 0.0


def variant_copies_share(variant: str) -> Optional[float]:
    """The share of the budget a variant name's `_copies<P>pct` part gives
    the gradients copying home in backward (TORCH_UVM_HOST_STEP_COPIES),
    or None where it has none."""
    m = re.search(r"_copies(\d+(?:\.\d+)?)pct(?:_|$)", variant)
    return float(m.group(1)) / 100 if m else None


def variant_threads(variant: str) -> Optional[int]:
    """The host step's threads a variant name's `_threads<N>` part gives
    (TORCH_UVM_HOST_STEP_THREADS), or None where it has none."""
    m = re.search(r"_threads(\d+)(?:_|$)", variant)
    return int(m.group(1)) if m else None


def gib_cell(nbytes: Optional[float]) -> str:
    """A table cell of bytes in GiB, or a dash where none were measured."""
    return "—" if nbytes is None else f"{nbytes / (1 << 30):.2f}"


def median_cell(s: Optional[dict], fmt: str = ".2f") -> str:
    """A table cell of a summary's median (summarize(), ratio()), or a dash."""
    return "—" if s is None else format(s["median"], fmt)


def print_comparisons(compared: Dict[str, Optional[dict]]) -> None:
    """The table of ratios (describe()'s rows) a benchmark prints last."""
    print("\n| ratio (each round's runs paired) | median (min–max) | target | |")
    print("|---|---|---|---|")
    for name, summary in compared.items():
        print(describe(name, summary))


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (and a line saying
    so) where matplotlib is missing: a benchmark then writes no plot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return None
    return plt


def process_driver(script: str, description: str, variants: List[str], extra: List[str],
                   run_variant: Callable[[str, bool], dict],
                   report: Callable[[dict, str, bool], object], rounds: int, only: str,
                   timeout: int, argv=None) -> None:
    """main() of a benchmark whose variants each run in a fresh process
    (`script --variant V`), interleaved round by round. With --variant, runs
    that one here (`run_variant(V, tiny)`) and prints its RESULT line; else
    runs `variants` (or those named by --variants, among them and `extra`,
    with ALWAYS kept) and writes `report(runs, out, tiny)` after every round,
    so a run cut short keeps the rounds it ran."""
    ap = driver_args(argparse.ArgumentParser(description=description), rounds=rounds, only=only)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(script)),
                                                  "results"))
    ap.add_argument("--tiny", nargs="?", const=1, default=0, type=int,
                    help="a 2-layer, hidden-256 Llama: the whole script in seconds")
    args = ap.parse_args(argv)
    if args.variant:
        print("RESULT " + json.dumps(run_variant(args.variant, bool(args.tiny))), flush=True)
        return
    known, chosen = list(variants) + list(extra), list(variants)
    if args.variants:
        keep = args.variants.split(",")
        unknown = [v for v in keep if v not in known]
        if unknown:
            ap.error(f"unknown variants {unknown}; known: {known}")
        chosen = [v for v in known if v in keep or v in ALWAYS]
    t0 = time.time()
    runs = interleaved(chosen, args.rounds, lambda v: spawn(
        os.path.abspath(script), timeout=timeout, variant=v, tiny=int(args.tiny)),
        after_round=lambda so_far, done: done < args.rounds and report(
            so_far, args.out, bool(args.tiny)))
    report(runs, args.out, bool(args.tiny))
    print(f"\n{len(chosen)} variants x {args.rounds} rounds in {time.time() - t0:.0f} s")


def chosen(plan: Dict[str, List[str]], only: str, variants: Optional[str],
           always=ALWAYS) -> List[str]:
    """The scenarios named by --only; with --variants, `plan` keeps only those
    and the variants named in `always` that it has."""
    scenarios = [s for s in only.split(",") if s in plan]
    if variants:
        keep = variants.split(",") + list(always)
        for s in scenarios:
            plan[s] = [v for v in plan[s] if v in keep]
        unknown = [v for v in variants.split(",") if not any(v in plan[s] for s in scenarios)]
        if unknown:
            print(f"not in the plan of {', '.join(scenarios)}, not run: {', '.join(unknown)}",
                  file=sys.stderr)
    return scenarios


def pinned_rate(nbytes: int = 1 << 30) -> dict:
    """The link's rate now: pinned copies of `nbytes` each way, best of 5 after
    one warm-up (GB/s). Run as a variant of its own in every round, so a
    physical limit and the runs it bounds share the machine's state."""
    import torch
    host = torch.ones(nbytes // 2, dtype=torch.float16).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    best = {"h2d_gbps": 0.0, "d2h_gbps": 0.0}
    for key, dst, src in (("h2d_gbps", dev, host), ("d2h_gbps", host, dev)):
        for _ in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best[key] = max(best[key], nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def shared_host_rates(nbytes: int = 1 << 30, copies: int = 12, elements: int = 1 << 26) -> dict:
    """What the link and the host's step do beside each other, for they share
    the host's memory: pinned copies of `nbytes` both ways at once, `copies`
    queued on a stream each way (GB/s each way); PyTorch's fused CPU AdamW
    over `elements` fp32 on a host step's threads (torch_uvm.host_step.threads():
    TORCH_UVM_HOST_STEP_THREADS, else every intra-op thread but two) alone, then stepping again and again
    while both ways' copies run (elements a second), and the copies' rates
    beside it."""
    import torch
    host_in = torch.ones(nbytes // 2, dtype=torch.float16).pin_memory()
    host_out = torch.empty_like(host_in).pin_memory()
    dev_in, dev_out = torch.empty_like(host_in, device="cuda"), torch.ones_like(host_in,
                                                                                 device="cuda")
    streams = torch.cuda.Stream(), torch.cuda.Stream()

    def both_ways():
        marks = []
        for stream, dst, src in zip(streams, (dev_in, host_out), (host_in, dev_out)):
            with torch.cuda.stream(stream):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                for _ in range(copies):
                    dst.copy_(src, non_blocking=True)
                end.record()
            marks.append((start, end))
        return marks

    def rates(marks):
        torch.cuda.synchronize()
        return [copies * nbytes / (a.elapsed_time(b) / 1e3) / 1e9 for a, b in marks]
    rates(both_ways())                       # a warm-up
    h2d, d2h = rates(both_ways())
    from torch_uvm.host_step import threads as host_step_threads
    threads, stepping = torch.get_num_threads(), host_step_threads()
    torch.set_num_threads(stepping)
    try:
        optimizer = _fused_adamw(elements)
        alone = _best_step_rate(optimizer, elements)
        marks = both_ways()
        n, t0 = 0, time.perf_counter()
        while not all(end.query() for _, end in marks):
            optimizer.step()
            n += 1
        beside = n * elements / (time.perf_counter() - t0)
        h2d_beside, d2h_beside = rates(marks)
    finally:
        torch.set_num_threads(threads)
    return {"both_ways_h2d_gbps": h2d, "both_ways_d2h_gbps": d2h,
            "host_step_threads": stepping,
            "adamw_alone_elements_per_s": alone, "adamw_beside_copies_elements_per_s": beside,
            "h2d_beside_adamw_gbps": h2d_beside, "d2h_beside_adamw_gbps": d2h_beside}


def describe_shared_host(r: dict) -> str:
    """shared_host_rates' answer as a line of text."""
    return (f"the host's memory, shared: pinned copies both ways at once "
            f"{r['both_ways_h2d_gbps']:.1f} / {r['both_ways_d2h_gbps']:.1f} GB/s; fused CPU AdamW "
            f"on {r['host_step_threads']} threads alone {r['adamw_alone_elements_per_s'] / 1e9:.2f} "
            f"G elements/s, beside both copies {r['adamw_beside_copies_elements_per_s'] / 1e9:.2f}, "
            f"the copies then {r['h2d_beside_adamw_gbps']:.1f} / {r['d2h_beside_adamw_gbps']:.1f} "
            f"GB/s")


def report_bound(row: dict, runs: List[dict]) -> None:
    """Runs under offload's gpu_memory (issue 55): the process's whole
    peak, what each held at CUDA's start and its run's peak over that, the
    most of `runs`, into `row` and printed beside the bound and the budget
    chosen within it."""
    whole = max(r["process_gpu_at_start_bytes"] + r["gpu_peak_run_bytes"] for r in runs)
    row["process_gpu_whole_peak_bytes"] = whole
    print(f"    gpu_memory {gib_cell(row['bound_bytes'])} GiB: the process's peak "
          f"{gib_cell(whole)} GiB (CUDA's start {gib_cell(row['process_gpu_at_start_bytes'])}"
          f" + the run's {gib_cell(row['gpu_peak_run_bytes'])}), the budget chosen "
          f"{gib_cell(row['budget_bytes'])} GiB")


def median_of(runs: List[Optional[dict]], key: str, default: float) -> float:
    """The median of `key` over a variant's runs, or `default` if none ran."""
    s = summarize([r[key] for r in runs if r])
    return default if s is None else s["median"]


def profiled(fn: Callable[[], None], path: str,
             spans: Optional[Callable[[], List[tuple]]] = None, cpu_ops: bool = True) -> dict:
    """Runs `fn` once under torch.profiler, writes the trace (Chrome/Perfetto
    JSON) to `path`, and returns where the GPU's time went: per stream, the
    milliseconds its kernels and copies took, and the span from the first
    GPU event to the last. Streams busy at once overlap: their times add up
    to more than the span. ``busy`` (busy_times) says how long any kernel,
    any copy to the GPU, any copy home and any host step ran, each counted
    once however many ran at once, over the span and within each
    ``phase::<name>`` range `fn` marked (record_function). `spans` gives
    more ranges as (name, start, end) in time.time_ns(): phases, and host
    steps (HostSteps.spans: a worker thread's ranges do not reach
    torch.profiler's trace). ``cpu_ops=False`` records the GPU's work alone:
    recording every operator on the host slows the launches it times."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    # record_shapes: a range's arguments (torch_uvm's bytes) reach the trace
    with profile(activities=[ProfilerActivity.CPU] * cpu_ops + [ProfilerActivity.CUDA],
                 record_shapes=cpu_ops) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    base = trace.get("baseTimeNanoseconds")
    if spans is not None and base is not None:     # the trace's ts: µs after its base
        events += [{"name": n, "cat": "span", "ts": (a - base) / 1e3, "dur": (b - a) / 1e3}
                   for n, a, b in spans()]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and "dur" in e]
    streams: Dict[str, dict] = {}
    for e in gpu:
        s = streams.setdefault(str(e.get("args", {}).get("stream")),
                               {"kernel_ms": 0.0, "copy_ms": 0.0, "events": 0})
        s["kernel_ms" if e["cat"] == "kernel" else "copy_ms"] += e["dur"] / 1e3
        s["events"] += 1
    span = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / 1e3 if gpu else 0
    return {"gpu_span_ms": span, "streams": streams, "torch_uvm": torch_uvm_ranges(events),
            "trace": path, "busy": busy_times(events)}


def torch_uvm_ranges(events: List[dict]) -> Dict[str, dict]:
    """torch_uvm's ranges in a trace, by kind (bring_ahead, write_home...):
    how many, the milliseconds the host spent in them, their bytes, and the
    milliseconds of their GPU side (gpu_ms). The profiler records a range
    again on each stream where work it launched ran (its copies): that
    time is the GPU's, not the host's, its bytes are not counted twice, and
    ranges nested in it (an eviction inside a bring) are in both."""
    ours: Dict[str, dict] = {}
    for e in events:
        if e.get("name", "").startswith("torch_uvm::") and "dur" in e and e.get("cat") != "span":
            o = ours.setdefault(e["name"].split(" ")[0],
                                {"count": 0, "cpu_ms": 0.0, "gpu_ms": 0.0, "bytes": 0})
            if e.get("cat") == "gpu_user_annotation":
                o["gpu_ms"] += e["dur"] / 1e3
                continue
            o["count"] += 1
            o["cpu_ms"] += e["dur"] / 1e3
            o["bytes"] += int(e.get("args", {}).get("bytes", 0) or 0)
    return ours


# what busy_times counts: a trace event's kind, or None
def _busy_kind(e: dict) -> Optional[str]:
    name = e.get("name", "")
    if e.get("cat") == "kernel":
        return "kernels"
    if e.get("cat") == "gpu_memcpy":
        return "to_gpu" if "HtoD" in name else "home" if "DtoH" in name else "on_gpu"
    if name.startswith("torch_uvm::host_step"):
        return "host_step"
    return None


def _union_ms(intervals: List[tuple], lo: float, hi: float) -> float:
    """Milliseconds of [lo, hi] (trace µs) that at least one interval covers."""
    total, end = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total / 1e3


def _host_waits(events: List[dict]) -> Optional[List[tuple]]:
    """The spans in which a thread that launches the GPU's kernels waited in
    a runtime or driver call for the GPU (cudaEventSynchronize,
    cudaStreamSynchronize, cudaDeviceSynchronize, their cu* forms), from
    the trace's cuda_runtime and cuda_driver events; None where the trace
    has none of those calls (then nothing can be said of the waits)."""
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e]
    if not calls:
        return None
    feeding = {(e.get("pid"), e.get("tid")) for e in calls if "LaunchKernel" in e.get("name", "")}
    return [(e["ts"], e["ts"] + e["dur"]) for e in calls
            if "Synchronize" in e.get("name", "") and (e.get("pid"), e.get("tid")) in feeding]


def busy_times(events: List[dict]) -> dict:
    """Within the span of the GPU's events, and within each ``phase::<name>``
    range: its milliseconds, and how many of them some kernel ran, some copy
    to the GPU ran, some copy home ran, a host step ran (torch_uvm::host_step
    ranges), and nothing on the GPU ran; each copy direction's bytes and its
    rate while busy (GB/s). Each counted once however many ran at once: a
    phase whose kernels and copies overlap shows busy times adding up to
    more than its length, one that serialises them shows them adding up to
    it. Where the trace has the runtime's calls: how long a thread that
    launches kernels waited for the GPU (``host_waits_ms``), and how much of
    the GPU's idle time fell in such a wait (``gpu_idle_in_host_waits_ms``:
    the GPU had nothing to do because the thread that feeds it waited for
    some other of its work, a copy or an event; in the rest, that thread
    ran, or waited outside the runtime: a lock, a host step's future).
    Threads are told apart by the trace's pid and tid."""
    kinds: Dict[str, List[tuple]] = {}
    moved = {"to_gpu": 0, "home": 0}
    for e in events:
        k = _busy_kind(e) if "dur" in e else None
        if k is None:
            continue
        kinds.setdefault(k, []).append((e["ts"], e["ts"] + e["dur"]))
        if k in moved:
            moved[k] += int(e.get("args", {}).get("bytes", 0) or 0)
    gpu = [iv for k in ("kernels", "to_gpu", "home", "on_gpu") for iv in kinds.get(k, [])]
    if not gpu:
        return {}
    windows = {"step": (min(a for a, _ in gpu), max(b for _, b in gpu))}
    for e in events:
        if e.get("name", "").startswith("phase::") and "dur" in e:
            windows[e["name"][len("phase::"):]] = (e["ts"], e["ts"] + e["dur"])
    waits = _host_waits(events)
    out = {}
    for name, (lo, hi) in windows.items():
        w = {"ms": (hi - lo) / 1e3, "gpu_idle_ms": (hi - lo) / 1e3 - _union_ms(gpu, lo, hi)}
        for k in ("kernels", "to_gpu", "home", "host_step"):
            w[f"{k}_ms"] = _union_ms(kinds.get(k, []), lo, hi)
        copies = kinds.get("to_gpu", []) + kinds.get("home", [])
        w["kernels_without_copies_ms"] = (_union_ms(kinds.get("kernels", []) + copies, lo, hi)
                                          - _union_ms(copies, lo, hi))
        if waits is not None:
            w["host_waits_ms"] = _union_ms(waits, lo, hi)
            w["gpu_idle_in_host_waits_ms"] = _union_ms(gpu + waits, lo, hi) - _union_ms(gpu, lo, hi)
        out[name] = w
    for k, n in moved.items():
        busy = _union_ms(kinds.get(k, []), *windows["step"])
        out["step"][f"{k}_gb"] = n / 1e9
        out["step"][f"{k}_gbps_while_busy"] = n / 1e6 / busy if busy else None
    return out


def describe_profile(name: str, p: dict) -> str:
    """A profiled() result as lines of text."""
    lines = [f"profile of one step, {name}: GPU span {p['gpu_span_ms']:.1f} ms ({p['trace']})"]
    for s, v in sorted(p["streams"].items(), key=lambda kv: -(kv[1]["kernel_ms"] + kv[1]["copy_ms"])):
        lines.append(f"  stream {s}: kernels {v['kernel_ms']:.1f} ms, copies {v['copy_ms']:.1f} ms "
                     f"({v['events']} events)")
    for what, v in sorted(p["torch_uvm"].items()):
        on_gpu = f", {v['gpu_ms']:.1f} ms on its stream" if v.get("gpu_ms") else ""
        lines.append(f"  {what}: {v['count']} ranges, {v['cpu_ms']:.1f} ms on the host{on_gpu}, "
                     f"{v['bytes'] / 2**20:.0f} MiB")
    for phase, w in p.get("busy", {}).items():
        lines.append(
            f"  {phase}: {w['ms']:.1f} ms; busy: kernels {w['kernels_ms']:.1f} (without a copy "
            f"beside them {w['kernels_without_copies_ms']:.1f}), to the GPU {w['to_gpu_ms']:.1f}, "
            f"home {w['home_ms']:.1f}, host step {w['host_step_ms']:.1f}; GPU idle "
            f"{w['gpu_idle_ms']:.1f}"
            + (f" ({w['gpu_idle_in_host_waits_ms']:.1f} of it while the thread feeding it "
               f"waited for the GPU: {w['host_waits_ms']:.1f} ms of waits)"
               if "host_waits_ms" in w else ""))
        for k in ("to_gpu", "home"):
            if w.get(f"{k}_gbps_while_busy"):
                lines.append(f"    {k}: {w[f'{k}_gb']:.2f} GB at {w[f'{k}_gbps_while_busy']:.1f} "
                             f"GB/s while busy")
    return "\n".join(lines)


# The least any placement must move (issue 36). A budget of B bytes holds at
# most B bytes of weights, so at least W - B bytes of the weights live
# elsewhere and must cross the link whenever they are read: whatever plan
# chose which ones. Our own plan may move more (what it keeps resident
# besides weights, rounding to whole units); a figure against its own bytes
# would flatter it.

def least_generation_bytes(weights: int, budget: int) -> int:
    """Bytes any placement must bring to the GPU per generated token: every
    weight is read once per token and at most `budget` of them stay."""
    return max(0, weights - budget)


def least_generation_limit(weights: int, budget: int, h2d: float) -> Optional[float]:
    """Tokens/s no placement can beat at `h2d` bytes/s to the GPU; None when
    the weights fit (the link bounds nothing)."""
    least = least_generation_bytes(weights, budget)
    return h2d / least if least > 0 and h2d else None


def least_training_bytes(weights: int, budget: int, h2d: float = 1.0, d2h: float = 1.0,
                         states: float = 2.0) -> dict:
    """Bytes any placement must move per step of a full fine-tune whose
    optimizer keeps `states` bytes per byte of weights (AdamW: two moments
    of the weights' dtype), with a budget of `budget` bytes on the GPU and the
    same arithmetic (the weights, gradients and states in their own dtypes).

    Each weight byte is placed one of three ways: streamed (no budget: to the
    GPU in forward and again in backward, its gradient home to a step on the
    CPU: 2 in, 1 out); resident with the step on the CPU (1 byte of budget:
    the gradient out, the stepped weight back: 1 in, 1 out); or resident with
    its states (1 + states bytes: nothing crosses). Stepping a weight on the
    GPU with states that are not resident moves them both ways, more than the
    CPU step moves. The best mix is a small linear program in y, the budget
    given to weights resident with their states (the rest of the budget to
    weights resident alone); its optimum is at a breakpoint of max(in / h2d,
    out / d2h), so the few candidates are tried. Returns the bytes each way,
    and the mix (weights resident alone, weights resident with states).

    The bytes cross in the weights' own dtype. Under bf16 autocast a
    placement could send the weights' bf16 casts and their bf16 gradients
    (the very values autocast makes) and step on the CPU, moving about half
    as much; this bound does not count that placement. `states` >= 1 (below
    it, stepping on the GPU with the states streamed would move less than
    the CPU step, a placement not counted either)."""
    if states < 1:
        raise ValueError(f"least_training_bytes counts optimizers with at least one state byte "
                         f"per weight byte (AdamW: 2), got states={states}")
    w, b, s = float(weights), float(min(budget, weights * (1 + states))), float(states)

    def mix(y):
        alone = max(0.0, min(b - y, w - y / (1 + s)))
        full = y / (1 + s)                      # weight bytes resident with their states
        return 2 * w - alone - 2 * full, w - full, alone, full
    # the breakpoints: none to states, every weight resident (past it, budget
    # goes to states), and where in / h2d = out / d2h (clipped to the
    # budget, it also stands for "all the budget to states")
    a, c = (s - 1) / (s + 1), 1 / (1 + s)
    ys = [0.0, (b - w) * (1 + s) / s, (w / d2h - (2 * w - b) / h2d) / (a / h2d + c / d2h)]
    best = min((mix(min(max(y, 0.0), b)) for y in ys),
               key=lambda m: max(m[0] / h2d, m[1] / d2h))
    to_gpu, home, alone, full = best
    return {"to_gpu_bytes": round(max(0.0, to_gpu)), "home_bytes": round(max(0.0, home)),
            "resident_alone_bytes": round(alone), "resident_with_states_bytes": round(full)}


def least_training_limit_s(weights: int, budget: int, h2d: float, d2h: float,
                           states: float = 2.0) -> float:
    """Seconds per step no placement can beat: least_training_bytes at `h2d`
    and `d2h` bytes/s, both directions at once."""
    b = least_training_bytes(weights, budget, h2d, d2h, states)
    return max(b["to_gpu_bytes"] / h2d, b["home_bytes"] / d2h)


def host_adamw_rate(elements: int = 1 << 28) -> dict:
    """The host's optimizer step now: torch.optim.AdamW(fused=True) on the
    CPU (PyTorch's fused CPU kernel, FSDP2's CPU step) over one fp32
    parameter of `elements` with its gradient, best of 3 after a first
    step that makes the states (fp32 elements stepped a second)."""
    import torch
    best = _best_step_rate(_fused_adamw(elements), elements)
    return {"host_adamw_elements_per_s": best, "host_threads": torch.get_num_threads()}


def _fused_adamw(elements: int):
    """A fused CPU AdamW over one fp32 parameter of `elements` with its
    gradient, stepped once (its states made)."""
    import torch
    p = torch.nn.Parameter(torch.zeros(elements))
    p.grad = torch.full_like(p, 1e-3)
    optimizer = torch.optim.AdamW([p], lr=1e-4, fused=True)
    optimizer.step()
    return optimizer


def _best_step_rate(optimizer, elements: int, tries: int = 3) -> float:
    """Elements a second of the fastest of `tries` steps."""
    best = 0.0
    for _ in range(tries):
        t0 = time.perf_counter()
        optimizer.step()
        best = max(best, elements / (time.perf_counter() - t0))
    return best


# The ways a full fine-tune can place a weight byte, and what each moves
# (floors.py owns them: per byte of fp32 weights, floors.FIELDS). PLACEMENTS: AdamW's two fp32 moments cross
# where a GPU steps a weight without them. PLACEMENTS_BF16_CASTS: under bf16
# autocast, what crosses for a host step is the weights' bf16 casts (the
# values autocast makes on the GPU) and their bf16 gradients, half the
# bytes; autocast leaves some weights uncast (an embedding's, a norm's:
# about 3% of a Llama's), so the least this gives is a little below what a
# model can take. torch_uvm does not place weights so (yet):
# least_step_s(..., PLACEMENTS_BF16_CASTS) says what it would leave.
PLACEMENTS = placements(states=2.0)
PLACEMENTS_BF16_CASTS = placements(states=2.0, casts=True)


def host_memory_rate(rates: dict) -> Optional[float]:
    """The most the host's memory carried at once in shared_host_rates'
    measurements (bytes/s): pinned copies both ways, the fused AdamW alone
    (ADAMW_HOST_MEMORY bytes a weight byte), or both beside each other.
    What it was seen to carry, so at most what it can: copies alone are
    bound by the link, the AdamW by its threads, and its writes' cache
    lines read first (write-allocate) are not counted. None where they did
    not run."""
    per_element = 4 * ADAMW_HOST_MEMORY         # bytes per fp32 weight stepped
    try:
        return max(1e9 * (rates["both_ways_h2d_gbps"] + rates["both_ways_d2h_gbps"]),
                   per_element * rates["adamw_alone_elements_per_s"],
                   per_element * rates["adamw_beside_copies_elements_per_s"]
                   + 1e9 * (rates["h2d_beside_adamw_gbps"] + rates["d2h_beside_adamw_gbps"]))
    except (KeyError, TypeError):
        return None


def least_step_s(weights: int, budget: int, h2d: float, d2h: float,
                 host_bytes_per_s: float, compute_s: float = 0.0,
                 host_memory_bytes_per_s: Optional[float] = None,
                 placements: Optional[dict] = None) -> dict:
    """Seconds per step no placement of a full fine-tune (fp32 weights,
    AdamW's two fp32 moments) can beat with this link *and this host*:
    least_training_bytes counts only the link, as if the host stepped for
    free; here the weights the host steps take `host_bytes_per_s` (weight
    bytes, host_adamw_rate x 4), the link both ways at once, and
    `compute_s` bounds it too (the GPU's forward and backward alone: a
    step that includes a GPU AdamW is no floor for a host step). Each
    weight byte is placed one of the PLACEMENTS ways; the best mix under
    `budget` is a linear program (scipy's linprog). Returns the seconds and
    the mix's bytes per placement. As in least_training_bytes, the bytes
    cross in fp32 (a placement sending bf16 casts under autocast moves
    less), and every streamed weight crosses in both passes (an untied
    embedding, not read in its backward, need not). `host_memory_bytes_per_s`
    (host_memory_rate): the link's copies and the host's AdamW also share
    the host's memory: every byte crossing either way, and
    ADAMW_HOST_MEMORY per weight byte the host steps, at that rate. That
    answer is an estimate, not a floor: the rate is what the host's memory
    was seen to carry, which a placement might exceed. `placements`: the
    ways a weight may be placed (PLACEMENTS; PLACEMENTS_BF16_CASTS where
    the weights' bf16 casts cross), each (to the GPU, home, stepped on the
    host, budget, the host's memory a weight byte the host steps takes)."""
    from scipy.optimize import linprog
    placements = placements or PLACEMENTS
    names = list(placements)
    cols = [placements[n] for n in names]
    g = float(1 << 30)          # in GiB and seconds: coefficients near 1 for the solver
    # variables: the weight GiB of each placement, then T; minimise T
    c = [0.0] * len(cols) + [1.0]
    a_ub = [[col[0] * g / h2d for col in cols] + [-1.0],
            [col[1] * g / d2h for col in cols] + [-1.0],
            [col[2] * g / host_bytes_per_s for col in cols] + [-1.0],
            [float(col[3]) for col in cols] + [0.0]]
    b_ub = [0.0, 0.0, 0.0, budget / g]
    if host_memory_bytes_per_s:
        a_ub.append([(col[0] + col[1] + col[4] * col[2]) * g / host_memory_bytes_per_s
                     for col in cols] + [-1.0])
        b_ub.append(0.0)
    a_eq, b_eq = [[1.0] * len(cols) + [0.0]], [weights / g]
    bounds = [(0, None)] * len(cols) + [(compute_s, None)]
    sol = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if not sol.success:
        raise RuntimeError(f"least_step_s: no placement found ({sol.message})")
    return {"seconds": float(sol.x[-1]),
            "mix_bytes": {n: round(float(x) * g) for n, x in zip(names, sol.x) if x * g > 0.5}}


def round_rates(rate_runs: List[Optional[dict]], key: str, rounds: int,
                default: Optional[float] = None) -> List[Optional[float]]:
    """The pinned rate of each round (bytes/s), so a limit pairs with the runs
    of the same round; a round whose pinned_rate failed takes the median of
    the others, or `default` (bytes/s) when none ran."""
    median = median_of(rate_runs, key, None)
    fill = median * 1e9 if median is not None else default
    out = [r[key] * 1e9 if r else fill for r in rate_runs]
    return (out + [fill] * rounds)[:rounds]


# Outputs against all-resident's (issue 36): every run has the resident
# variant, and every variant's outputs (losses, tokens) are compared with its
# first run, at the benchmark's own scale.

def max_abs_difference(a: Optional[list], b: Optional[list]) -> Optional[float]:
    """The largest |a[i] - b[i]|; None when either is missing or the lengths
    differ (nothing to compare element by element)."""
    if a is None or b is None or len(a) != len(b):
        return None
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def outputs_check(outputs: List[list], reference: Optional[list]) -> dict:
    """Every run's outputs against the reference: `same` (all bit for bit
    equal; None without a reference) and the largest element difference over
    the runs (None where one cannot be compared)."""
    if reference is None:
        return {"same": None, "max_abs_difference": None}
    diffs = [max_abs_difference(o, reference) for o in outputs]
    return {"same": all(o == reference for o in outputs),
            "max_abs_difference": None if None in diffs or not diffs else max(diffs)}


def describe_check(check: dict, exact: bool = True) -> str:
    """A table cell for outputs_check: True/False where the variant computes
    the same arithmetic as all-resident (a False also gives the difference),
    the largest difference where it cannot be bit for bit by nature (another
    optimizer kernel, a CPU step)."""
    same, diff = check["same"], check["max_abs_difference"]
    if same is None:
        return "no resident run"
    text = "n/a" if diff is None else f"{diff:.2g}"
    if exact:
        return "True" if same else f"False (max abs diff {text})"
    return "0 (bit for bit)" if same else f"max abs diff {text}"


# The process's GPU memory, measured by the driver (issue 36): an allocator's
# or an offload's books say what they meant to hold; cudaMemGetInfo says
# what the device gave the process, gradients, workspaces and all.

class ProcessGpuMemory:
    """Samples the device's free memory in a background thread while the
    body runs; `result()` is the peak the process took beyond a baseline read
    after CUDA's context and a warm-up kernel (the context and that kernel's
    block are excluded). Use as a context manager; without CUDA it measures
    nothing and `result()` is None.

    cudaMemGetInfo counts the whole device, so another process on the same
    GPU counts too; and a peak shorter than the interval (or than the GIL
    lets the thread wake) can be missed: `samples` and `seconds` say how
    densely it looked, and max_memory_reserved (exact, PyTorch's allocator
    only) is reported beside it."""

    def __init__(self, interval_s: float = 0.002, device: int = 0):
        self.interval_s, self.device = interval_s, device
        self.baseline_free: Optional[int] = None   # None: no CUDA, nothing measured
        self.peak = 0                               # most of baseline_free - free seen
        self.samples = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "ProcessGpuMemory":
        try:
            import torch
            if not torch.cuda.is_available():
                return self
            warm = torch.ones(1, device=f"cuda:{self.device}")
            warm.add_(1)
            torch.cuda.synchronize(self.device)
            del warm
            self.baseline_free = torch.cuda.mem_get_info(self.device)[0]
        except (ImportError, RuntimeError, AssertionError):
            self.baseline_free = None
            return self
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def sample(self) -> None:
        """One reading now (also callable from the measured code, at a
        moment it knows to be a peak)."""
        if self.baseline_free is None:
            return
        import torch
        free = torch.cuda.mem_get_info(self.device)[0]
        self.peak = max(self.peak, self.baseline_free - free)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            import torch
            torch.cuda.synchronize(self.device)
            self.sample()
            self.seconds = time.perf_counter() - self._t0
        return False

    def result(self) -> Optional[dict]:
        """{"peak_bytes", "baseline_free_bytes", "samples", "seconds",
        "max_memory_reserved", and torch_uvm's slot peaks when it is
        imported}; None without CUDA."""
        if self.baseline_free is None:
            return None
        import sys
        import torch
        out = {"peak_bytes": self.peak, "baseline_free_bytes": self.baseline_free,
               "samples": self.samples, "seconds": self.seconds}
        try:
            out["max_memory_reserved"] = torch.cuda.max_memory_reserved(self.device)
        except RuntimeError:
            out["max_memory_reserved"] = None
        uvm = sys.modules.get("torch_uvm")   # only if the variant imported it
        if uvm is not None:
            stats = uvm.memory_stats()
            for key in ("reserved_bytes.peak", "allocated_bytes.peak"):
                value = stats.get(f"slots.cuda:{self.device}.{key}")
                if value is not None:
                    out["slot_" + key.replace(".", "_")] = value
        return out


def host_peak_bytes() -> int:
    """The process's peak resident host memory (pinned pages among it)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def with_process_gpu_memory(measure: Callable[[], dict], uvm: bool) -> dict:
    """`measure()`'s result (one variant, in this process), with the
    process's GPU memory measured by the driver around everything that
    touches the GPU, and the host's peak; under offload's gpu_memory (its result has
    `bound_bytes`), also what the process held at CUDA's start and the run's
    peak over it (report_bound). `uvm`: UVM is turned on first, before CUDA
    starts (the sampler's warm-up)."""
    import torch
    if uvm:
        import torch_uvm
        torch_uvm.set_enabled_uvm(True)
    gpu = ProcessGpuMemory()
    with gpu:
        result = measure()
    result["process_gpu_memory"] = gpu.result()
    result.setdefault("host_peak_bytes", host_peak_bytes())
    if result.get("bound_bytes") and result["process_gpu_memory"]:   # against the whole process
        result["process_gpu_at_start_bytes"] = torch.cuda.mem_get_info()[1] - gpu.baseline_free
        result["gpu_peak_run_bytes"] = result["process_gpu_memory"]["peak_bytes"]
    return result


def gpu_memory_cell(results: List[Optional[dict]]) -> str:
    """A table cell: the largest ProcessGpuMemory peak over a variant's runs,
    in GiB ("—" where nothing was measured)."""
    peaks = [r["peak_bytes"] for r in results if r]
    return f"{max(peaks) / (1 << 30):.2f} GiB" if peaks else "—"
