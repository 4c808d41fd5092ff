"""Larger than the GPU (issue 10): a model and a dataset streamed through a
residency budget, side by side with the anchors of OFFLOAD.md.

    python benchmarks/larger_than_gpu.py [--rounds 3] [--out DIR] [--only model,model512,stream]

(a) model: 16 fp16 Linear(8192, 8192) (2 GiB), batch 16, under a 1 GiB budget:
    all resident, torch_uvm.offload, a hand-written pinned double-buffered
    stream with the same resident share, accelerate cpu_offload, and
    accelerate dispatch_model with the same GPU share; and
    torch_uvm_bound_<G>GiB, offload(gpu_memory=G GiB, inputs=x): the whole
    process held to G, the budget chosen within it from the model's inputs
    (G about what the 1 GiB budget's process took).
(p) model512: the same model at batch 512 (prefill-like: torch_uvm copies the
    streamed layers into GPU memory one layer ahead), against the pinned
    stream with the same GPU memory.
(d) stream: a 4 GiB tensor consumed in 64 MiB batches by a GPU kernel under a
    1 GiB budget: torch_uvm.prefetching, a pinned double-buffered copy loop,
    and naive zero-copy moves (no budget).

Each variant runs in a fresh process (UVM on or off as it needs), variants
interleaved round by round; the table gives the median of the rounds and the
min-max. Writes larger_than_gpu.json and .png to --out.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torch_uvm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # method
import method  # noqa: E402
MiB, GiB = 1 << 20, 1 << 30
LAYERS, WIDTH, BATCH, BUDGET = 16, 8192, 16, 1 * GiB
LAYER_BYTES = WIDTH * WIDTH * 2
AHEAD = 1
# Prefetching, torch_uvm keeps the prefix that fits the budget less (ahead + 1)
# layers; reading the streamed layers in place, the prefix that fits the budget.
RESIDENT = (BUDGET - (AHEAD + 1) * LAYER_BYTES) // LAYER_BYTES
RESIDENT_IN_PLACE = BUDGET // LAYER_BYTES
STREAM_TOTAL, STREAM_BATCH, STREAM_BUDGET = 4 * GiB, 64 * MiB, 1 * GiB
PLAN = {
    # torch_uvm_offload: mode auto, which reads in place at batch 16; each
    # torch_uvm mode against a pinned stream keeping the same layers resident
    "model": ["pinned_rate", "resident", "torch_uvm_offload", "torch_uvm_offload_prefetch",
              "pinned_stream_same_share", "pinned_stream", "accelerate_dispatch",
              "accelerate_cpu_offload", "torch_uvm_bound_2GiB"],
    # unbounded: torch_uvm.prefetching with no budget (nothing leaves), to
    # tell the eviction's cost from the prefetch's
    "model512": ["pinned_rate", "resident", "torch_uvm_offload", "pinned_stream", "pinned_stream_same_share"],
    "stream": ["torch_uvm_prefetching", "torch_uvm_prefetching_unbounded", "pinned_copy",
               "naive_moves"],
}
BATCHES = {"model": BATCH, "model512": 512}


def uses_uvm(variant: str) -> bool:
    """The variants that run with UVM on: torch_uvm's (torch_uvm_bound_<G>GiB
    for any G among them) and the naive moves."""
    return variant.startswith("torch_uvm") or variant == "naive_moves"


# --- the variants (each runs in its own process) ------------------------------

def build_model():
    import torch
    g = torch.Generator().manual_seed(0)
    bound = WIDTH ** -0.5
    layers = []
    for _ in range(LAYERS):
        layer = torch.nn.Linear(WIDTH, WIDTH, bias=False, dtype=torch.float16, device="meta")
        w = torch.empty(WIDTH, WIDTH, dtype=torch.float16).uniform_(-bound, bound, generator=g)
        layer.weight = torch.nn.Parameter(w, requires_grad=False)
        layers.append(layer)
    return torch.nn.Sequential(*layers)


def time_forwards(fn, warmup=2, iters=5):
    import torch
    for _ in range(warmup):
        out = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], out


def pinned_stream_forward(model, keep):
    """Hand-written: the first `keep` layers on the GPU, the rest in pinned
    memory, copied into two GPU buffers on a side stream one layer ahead."""
    import torch
    resident = [l.weight.cuda() for l in model[:keep]]
    host = [l.weight.pin_memory() for l in model[keep:]]
    bufs = [torch.empty_like(host[0], device="cuda") for _ in range(2)]
    side = torch.cuda.Stream()
    copied = [torch.cuda.Event() for _ in range(2)]
    used = [torch.cuda.Event() for _ in range(2)]

    def forward(x):
        compute = torch.cuda.current_stream()
        for w in resident:
            x = torch.nn.functional.linear(x, w)

        def issue(i):
            b = i % 2
            side.wait_event(used[b])
            with torch.cuda.stream(side):
                bufs[b].copy_(host[i], non_blocking=True)
                copied[b].record(side)
        issue(0)
        for i in range(len(host)):
            if i + 1 < len(host):
                issue(i + 1)
            compute.wait_event(copied[i % 2])
            x = torch.nn.functional.linear(x, bufs[i % 2])
            used[i % 2].record(compute)
        return x
    return forward, (keep + 2) * LAYER_BYTES, (LAYERS - keep) * LAYER_BYTES


def measured_resident_bytes(model):
    """Residency measured apart from torch_uvm's accounting: a read kernel over
    a weight resident on the GPU runs at HBM speed (600+ GB/s for 128 MiB),
    over one in host memory at PCIe speed (50 GB/s or less). Weights read in
    place stay where they are; a read-mostly weight read now gains a GPU copy,
    so this runs once, after the timed forwards."""
    import torch
    total = 0
    torch.ones(1 << 20, dtype=torch.float16, device="cuda").sum()   # the kernel's first launch
    for layer in model:
        w = layer.weight
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        w.sum()
        torch.cuda.synchronize()
        if LAYER_BYTES / (time.perf_counter() - t0) > 200e9:
            total += LAYER_BYTES
    return total


def run_model(variant, scenario="model"):
    """One variant in this process: its result, with the process's GPU memory
    measured by the driver around everything that touches the GPU."""
    if variant == "pinned_rate":
        return method.pinned_rate()
    return method.with_process_gpu_memory(lambda: measure_model(variant, scenario),
                                          uvm=uses_uvm(variant))


def measure_model(variant, scenario):
    import torch
    if uses_uvm(variant):
        import torch_uvm
    model = build_model().eval()
    x = torch.randn(BATCHES[scenario], WIDTH,
                    generator=torch.Generator().manual_seed(1)).half().cuda()
    moved = peak = None
    bound = {}
    with torch.no_grad():
        if variant == "resident":
            model.cuda()
            forward = model
            moved, peak = 0, LAYERS * LAYER_BYTES
        elif variant.startswith("torch_uvm_offload"):
            handle = torch_uvm.offload(model, budget=BUDGET, device="cuda", ahead=AHEAD,
                                       mode="prefetch" if variant.endswith("prefetch") else "auto")
            forward = model
        elif variant.startswith("torch_uvm_bound_"):   # the budget chosen within the bound
            torch.cuda.empty_cache()      # (what building the inputs left cached is not the process's)
            bound["bound_bytes"] = int(method.variant_bound_gib(variant) * GiB)
            handle = torch_uvm.offload(model, gpu_memory=bound["bound_bytes"], device="cuda",
                                       ahead=AHEAD, mode="auto", inputs=x)
            bound["budget_bytes"] = handle.state.bound.budget
            forward = model
        elif variant == "pinned_stream":
            forward, peak, moved = pinned_stream_forward(model, RESIDENT)
        elif variant == "pinned_stream_same_share":
            forward, peak, moved = pinned_stream_forward(model, RESIDENT_IN_PLACE)
        elif variant == "accelerate_cpu_offload":
            from accelerate import cpu_offload
            cpu_offload(model, execution_device=torch.device("cuda", 0))
            forward, moved, peak = model, LAYERS * LAYER_BYTES, 1 * LAYER_BYTES
        elif variant == "accelerate_dispatch":
            from accelerate import dispatch_model
            gpu_layers = BUDGET // LAYER_BYTES
            dispatch_model(model, device_map={str(i): 0 if i < gpu_layers else "cpu"
                                              for i in range(LAYERS)}, main_device=0)
            forward = model
            moved, peak = (LAYERS - gpu_layers) * LAYER_BYTES, (gpu_layers + 1) * LAYER_BYTES
        uvm = variant.startswith(("torch_uvm_offload", "torch_uvm_bound_"))
        if uvm:
            forward(x)                                   # learns the order
            torch.cuda.synchronize()
            before = torch_uvm.residency_stats()
        ms, out = time_forwards(lambda: forward(x))
        extra = {}
        if uvm:
            after = torch_uvm.residency_stats()
            resident = len(handle.resident_units())
            # read in place, every streamed layer crosses PCIe once per forward
            moved = (after["prefetched_bytes"] - before["prefetched_bytes"]) / 7 \
                if handle.mode == "prefetch" else (LAYERS - resident) * LAYER_BYTES
            peak = after["resident_bytes.peak"]
            extra = {"mode": handle.mode, "resident_layers": resident,
                     "evictions": {k: after[k] - before[k] for k in after if k.startswith("evict")},
                     "accounted_resident_bytes": after["resident_bytes.current"],
                     "measured_resident_bytes": measured_resident_bytes(model)}
    torch.save(out.float().cpu(), f"/tmp/ltg_out_{scenario}_{variant}.pt")
    return {"ms": ms, "moved_bytes": moved, "peak_resident_bytes": peak, **extra, **bound}


def run_stream(variant):
    import torch
    if uses_uvm(variant):
        import torch_uvm
        torch_uvm.set_enabled_uvm(True)
    n = STREAM_TOTAL // 2
    per = STREAM_BATCH // 2
    acc = torch.zeros((), dtype=torch.float32, device="cuda")
    if variant == "pinned_copy":
        host = torch.ones(n, dtype=torch.float16).pin_memory()
        bufs = [torch.empty(per, dtype=torch.float16, device="cuda") for _ in range(2)]
        side = torch.cuda.Stream()
        copied = [torch.cuda.Event() for _ in range(2)]
        used = [torch.cuda.Event() for _ in range(2)]

        def one_pass():
            compute = torch.cuda.current_stream()
            chunks = host.split(per)

            def issue(i):
                side.wait_event(used[i % 2])
                with torch.cuda.stream(side):
                    bufs[i % 2].copy_(chunks[i], non_blocking=True)
                    copied[i % 2].record(side)
            issue(0)
            for i in range(len(chunks)):
                if i + 1 < len(chunks):
                    issue(i + 1)
                compute.wait_event(copied[i % 2])
                acc.add_(torch.sum(bufs[i % 2], dtype=torch.float32))
                used[i % 2].record(compute)
        peak = 2 * STREAM_BATCH
    else:
        data = torch.ones(n, dtype=torch.float16)       # managed, on the CPU
        if variant.startswith("torch_uvm_prefetching"):
            if variant == "torch_uvm_prefetching":
                torch_uvm.set_residency_limit(STREAM_BUDGET)

            def one_pass():
                for b in torch_uvm.prefetching(data.split(per), "cuda", ahead=2):
                    acc.add_(torch.sum(b, dtype=torch.float32))
        else:
            def one_pass():
                for b in data.split(per):
                    acc.add_(torch.sum(b.to("cuda"), dtype=torch.float32))
        peak = None
    times = []
    for _ in range(3):    # the first pass finds every page on the CPU
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        one_pass()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    first = times[0]
    times.sort()
    ok = acc.item() == 3 * n
    if variant.startswith("torch_uvm_prefetching"):
        peak = torch_uvm.residency_stats()["resident_bytes.peak"]
    elif variant == "naive_moves":
        peak = STREAM_TOTAL   # nothing leaves: every page stays on the GPU
    return {"gbps": STREAM_TOTAL / times[1] / 1e9, "first_pass_gbps": STREAM_TOTAL / first / 1e9,
            "seconds": times, "correct": ok,
            "peak_resident_bytes": peak}


# --- the driver --------------------------------------------------------------------

def spread(values):
    return method.summarize([v for v in values if v is not None])


def comparisons(runs: dict) -> dict:
    """The ratios issue 10 sets targets for, round by round."""
    def metric(scenario, variant, key):
        return [r[key] if r else None for r in runs.get(scenario, {}).get(variant, [])]
    out = {}
    if "model" in runs:
        uvm = metric("model", "torch_uvm_offload", "ms")
        out["(a) torch_uvm.offload (auto: in place) / pinned stream, same resident layers"] = \
            method.ratio(uvm, metric("model", "pinned_stream_same_share", "ms"), target=1.15)
        out["(a) torch_uvm.offload (auto: in place) / pinned stream, same GPU budget"] = \
            method.ratio(uvm, metric("model", "pinned_stream", "ms"), target=1.1)
        out["(a) torch_uvm.offload (prefetch) / pinned stream, same resident layers"] = \
            method.ratio(metric("model", "torch_uvm_offload_prefetch", "ms"),
                         metric("model", "pinned_stream", "ms"), target=1.15)
        for v in ("accelerate_dispatch", "accelerate_cpu_offload"):
            out[f"(a) {v} / torch_uvm.offload, ms per forward"] = method.ratio(
                metric("model", v, "ms"), uvm, target=10, lower_is_better=False)
    if "model512" in runs:
        out["(p) batch 512: torch_uvm.offload (auto: prefetch) / pinned stream, same GPU memory"] = \
            method.ratio(metric("model512", "torch_uvm_offload", "ms"),
                         metric("model512", "pinned_stream", "ms"), target=1.1)
    if "stream" in runs:
        out["(d) torch_uvm.prefetching / pinned copy loop, GB/s"] = method.ratio(
            metric("stream", "torch_uvm_prefetching", "gbps"),
            metric("stream", "pinned_copy", "gbps"), lower_is_better=False)
    return out


def model_table(runs, scenario):
    """Prints one model scenario's table and returns it."""
    import torch
    batch = BATCHES[scenario]
    print(f"\n({'a' if scenario == 'model' else 'p'}) 16 x fp16 Linear(8192, 8192) = 2 GiB, "
          f"batch {batch}, budget 1 GiB (resident layers: torch_uvm in place "
          f"{RESIDENT_IN_PLACE}, prefetching {RESIDENT}; pinned_stream_same_share "
          f"{RESIDENT_IN_PLACE} + 2 buffers, pinned_stream {RESIDENT} + 2 buffers = the budget)")
    print("| variant | ms / forward (median, min-max) | x torch_uvm | peak resident | "
          "moved / forward | output = all resident | resident at the end: accounted / "
          "measured by read speed | process GPU memory |")
    print("|---|---|---|---|---|---|---|---|")
    ref_path = f"/tmp/ltg_out_{scenario}_resident.pt"
    ref = torch.load(ref_path) if os.path.exists(ref_path) else None
    uvm_ms = [r["ms"] if r else None for r in runs[scenario]["torch_uvm_offload"]]
    table = {}
    for v, rs in runs[scenario].items():
        if v == "pinned_rate":
            continue
        ok = [r for r in rs if r]
        if not ok:
            print(f"| {v} | failed | | | | | | |")
            continue
        ms = spread([r["ms"] for r in ok])
        ratio = method.ratio([r["ms"] if r else None for r in rs], uvm_ms) or \
            {"median": float("nan"), "min": float("nan"), "max": float("nan")}
        same = None
        if ref is not None and os.path.exists(f"/tmp/ltg_out_{scenario}_{v}.pt"):
            same = bool(torch.equal(torch.load(f"/tmp/ltg_out_{scenario}_{v}.pt"), ref))
        table[v] = {"ms": ms, "ratio_to_torch_uvm": ratio, "bit_identical": same,
                    **{k: ok[-1][k] for k in ok[-1] if k != "ms"}}
        check = f"{ok[-1]['accounted_resident_bytes'] / MiB:.0f} / " \
            f"{ok[-1]['measured_resident_bytes'] / MiB:.0f} MiB" \
            if "measured_resident_bytes" in ok[-1] else ""
        print(f"| {v} | {ms['median']:.1f} ({ms['min']:.1f}-{ms['max']:.1f}) | "
              f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) | "
              f"{ok[-1]['peak_resident_bytes'] / MiB:.0f} MiB | "
              f"{ok[-1]['moved_bytes'] / MiB:.0f} MiB | {same} | {check} | "
              f"{method.gpu_memory_cell([r.get('process_gpu_memory') for r in ok])} |")
        if ok[-1].get("bound_bytes"):
            method.report_bound(table[v], ok)
    rates = runs[scenario].get("pinned_rate", [])
    rate = method.median_of(rates, "h2d_gbps", 55.0)
    limit = (LAYERS * LAYER_BYTES - BUDGET) / (rate * 1e9) * 1e3
    print(f"physical limit at the pinned rate {'measured in this run' if any(rates) else 'assumed'}"
          f" ({rate:.1f} GB/s) for the {LAYERS * LAYER_BYTES - BUDGET >> 20} MiB that must "
          f"cross: {limit:.1f} ms")
    return table


def main():
    ap = method.driver_args(argparse.ArgumentParser(), rounds=3, only="model,model512,stream")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    if args.variant:
        r = run_stream(args.variant) if args.scenario == "stream" else \
            run_model(args.variant, args.scenario)
        print("RESULT " + json.dumps(r), flush=True)
        return
    import torch
    scenarios = method.chosen(PLAN, args.only, args.variants)
    runs = method.scenario_runs(os.path.abspath(__file__), PLAN, scenarios, args.rounds)
    result = {"runs": runs}
    for scenario in ("model", "model512"):
        if scenario in runs:
            result[f"{scenario}_table"] = model_table(runs, scenario)
    if "stream" in runs:
        print(f"\n(d) 4 GiB consumed in 64 MiB batches by a GPU kernel, budget 1 GiB")
        print("| variant | GB/s (median of rounds of the median pass; min-max) | first pass GB/s | "
              "peak resident | sum correct |")
        print("|---|---|---|---|---|")
        table = {}
        for v, rs in runs["stream"].items():
            ok = [r for r in rs if r]
            if not ok:
                print(f"| {v} | failed | | |")
                continue
            g = spread([r["gbps"] for r in ok])
            first = spread([r["first_pass_gbps"] for r in ok])
            table[v] = {"gbps": g, "first_pass_gbps": first,
                        "peak_resident_bytes": ok[-1]["peak_resident_bytes"],
                        "correct": all(r["correct"] for r in ok)}
            print(f"| {v} | {g['median']:.1f} ({g['min']:.1f}-{g['max']:.1f}) | "
                  f"{first['median']:.1f} ({first['min']:.1f}-{first['max']:.1f}) | "
                  f"{ok[-1]['peak_resident_bytes'] / MiB:.0f} MiB | {table[v]['correct']} |")
        result["stream_table"] = table
    compared = comparisons(runs)
    method.print_comparisons(compared)
    os.makedirs(args.out, exist_ok=True)
    method.write(os.path.join(args.out, "larger_than_gpu.json"), compared, **result)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        for ax, key, metric, label in [(axes[0], "model_table", "ms", "ms / forward (log)"),
                                       (axes[1], "stream_table", "gbps", "GB/s")]:
            table = result.get(key, {})
            names = list(table)
            med, err = method.error_bars([table[n][metric] for n in names])
            ax.bar(names, med, yerr=err, capsize=4)
            ax.set_ylabel(label)
            ax.tick_params(axis="x", rotation=25)
            if metric == "ms":
                ax.set_yscale("log")
        axes[0].set_title("(a) 2 GiB model, 1 GiB budget")
        axes[1].set_title("(d) 4 GiB in 64 MiB batches, 1 GiB budget")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "larger_than_gpu.png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no plot")


if __name__ == "__main__":
    main()
