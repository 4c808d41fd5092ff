"""How every benchmark compares (issue 12): variants run interleaved, each
run in a fresh process where the allocator must differ, and a comparison is
the ratio of two variants measured in the same round, reported as the median
with its min-max over the rounds.

A result file (JSON) holds {"machine": {...}, "comparisons": {name: summary}}
where a summary is {"ratios": [...], "median", "min", "max", "target",
"straddles", "lower_is_better"}; benchmarks/compare.py prints the change of
each ratio between two such files.
"""
import json
import subprocess
import time
from typing import Callable, Dict, List, Optional


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
    """Runs A B C, A B C, ... `rounds` times; result[v][i] is round i's run of
    v (None when it failed), so ratios pair runs of the same round.
    `after_round(result so far, rounds done)` runs after each round."""
    out: Dict[str, List[Optional[dict]]] = {v: [] for v in variants}
    for r in range(rounds):
        print(f"round {r + 1}/{rounds}", flush=True)
        for v in variants:
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


def chosen(plan: Dict[str, List[str]], only: str, variants: Optional[str]) -> List[str]:
    """The scenarios named by --only; with --variants, `plan` keeps only those."""
    scenarios = [s for s in only.split(",") if s in plan]
    if variants:
        keep = variants.split(",")
        for s in scenarios:
            plan[s] = [v for v in plan[s] if v in keep]
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


def median_of(runs: List[Optional[dict]], key: str, default: float) -> float:
    """The median of `key` over a variant's runs, or `default` if none ran."""
    s = summarize([r[key] for r in runs if r])
    return default if s is None else s["median"]


def profiled(fn: Callable[[], None], path: str) -> dict:
    """Runs `fn` once under torch.profiler, writes the trace (Chrome/Perfetto
    JSON) to `path`, and returns where the GPU's time went: per stream, the
    milliseconds its kernels and copies took, and the span from the first
    GPU event to the last. Streams busy at once overlap: their times add up
    to more than the span."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    # record_shapes: a range's arguments (torch_uvm's bytes) reach the trace
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=True) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and "dur" in e]
    streams: Dict[str, dict] = {}
    for e in gpu:
        s = streams.setdefault(str(e.get("args", {}).get("stream")),
                               {"kernel_ms": 0.0, "copy_ms": 0.0, "events": 0})
        s["kernel_ms" if e["cat"] == "kernel" else "copy_ms"] += e["dur"] / 1e3
        s["events"] += 1
    span = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / 1e3 if gpu else 0
    ours = {}
    for e in events:
        if e.get("name", "").startswith("torch_uvm::") and "dur" in e:
            what = e["name"].split(" ")[0]
            o = ours.setdefault(what, {"count": 0, "cpu_ms": 0.0, "bytes": 0})
            o["count"] += 1
            o["cpu_ms"] += e["dur"] / 1e3
            o["bytes"] += int(e.get("args", {}).get("bytes", 0) or 0)
    return {"gpu_span_ms": span, "streams": streams, "torch_uvm": ours, "trace": path}


def describe_profile(name: str, p: dict) -> str:
    """A profiled() result as lines of text."""
    lines = [f"profile of one step, {name}: GPU span {p['gpu_span_ms']:.1f} ms ({p['trace']})"]
    for s, v in sorted(p["streams"].items(), key=lambda kv: -(kv[1]["kernel_ms"] + kv[1]["copy_ms"])):
        lines.append(f"  stream {s}: kernels {v['kernel_ms']:.1f} ms, copies {v['copy_ms']:.1f} ms "
                     f"({v['events']} events)")
    for what, v in sorted(p["torch_uvm"].items()):
        lines.append(f"  {what}: {v['count']} ranges, {v['cpu_ms']:.1f} ms on the host, "
                     f"{v['bytes'] / 2**20:.0f} MiB")
    return "\n".join(lines)
