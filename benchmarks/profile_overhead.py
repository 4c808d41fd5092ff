"""What seeing what moves costs (issue 22): a training step of an offloaded
model, streamed managed batches, and allocations, each with profiling off,
with torch_uvm.profile() recording the residency timeline only
(counters=False), and with the driver's counters too. Variants alternate
step by step in one process (they differ only in what records), over
--rounds rounds; each ratio is against "off" in the same round.

Off, a policy event costs one branch and a torch_uvm range one
RecordFunction check; the "off" rows here are the baseline the others are
measured against, and the allocation row bounds what those checks cost.

    python3 benchmarks/profile_overhead.py --out DIR [--rounds 7]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torch_uvm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # method
import method  # noqa: E402

MiB = 1 << 20
VARIANTS = ("off", "timeline", "timeline+counters")


def recording(variant):
    import contextlib
    import warnings

    import torch_uvm
    if variant == "off":
        return contextlib.nullcontext(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch_uvm.profile(counters=variant == "timeline+counters")


def timed(variant, fn):
    import torch
    torch.cuda.synchronize()
    with recording(variant) as p:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    events = 0 if p is None else len(p.timeline()) + len(p.driver)
    return seconds, events


def workloads():
    import torch
    import torch_uvm
    torch_uvm.set_enabled_uvm(True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)])   # 1 GiB
    handle = torch_uvm.offload(model, budget=512 * MiB, device="cuda")
    opt = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True),
                                  step_in_backward=True)
    x = torch.randn(256, 4096, device="cuda")

    def train_step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    torch_uvm.set_residency_limit(None)
    data = torch.ones(64 * MiB, dtype=torch.float32)          # 256 MiB of managed batches
    batches = list(data.split(4 * MiB))

    def batches_streamed():
        total = torch.zeros((), device="cuda")
        for b in torch_uvm.prefetching(batches, "cuda", ahead=2):
            total += b.sum()
        torch_uvm.evict()
        torch_uvm.prefetch(data, "cpu")           # the next round starts from the host

    def allocations():
        for _ in range(2000):
            t = torch.empty(MiB // 4, device="cuda")
            del t

    for fn in (train_step, batches_streamed, allocations):   # warm
        fn()
    return {"train_step": train_step, "managed_batches": batches_streamed,
            "alloc_2000": allocations}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="profile_overhead")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch
    if not torch.cuda.is_available():
        print("profile_overhead: needs a GPU")
        return
    work = workloads()
    times = {w: {v: [] for v in VARIANTS} for w in work}
    events = {w: {v: 0 for v in VARIANTS} for w in work}
    for r in range(args.rounds):
        for w, fn in work.items():
            for v in VARIANTS:
                s, n = timed(v, fn)
                times[w][v].append(s)
                events[w][v] = n
    comparisons = {}
    lines = ["| workload | off, ms | timeline / off | timeline+counters / off | events recorded |",
             "|---|---|---|---|---|"]
    for w in work:
        off = method.summarize(times[w]["off"])
        cells = [f"{off['median'] * 1e3:.2f} ({off['min'] * 1e3:.2f}–{off['max'] * 1e3:.2f})"]
        for v in VARIANTS[1:]:
            c = method.ratio(times[w][v], times[w]["off"])
            comparisons[f"{w}: {v} / off"] = c
            cells.append(f"{c['median']:.3f} ({c['min']:.3f}–{c['max']:.3f})")
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {events[w]['timeline+counters']} |")
    spread = {w: method.ratio(times[w]["off"][1:], times[w]["off"][:-1]) for w in work}
    lines.append("")
    lines.append("round-to-round spread of 'off' itself (off[r+1]/off[r]): " + ", ".join(
        f"{w} {s['min']:.3f}–{s['max']:.3f}" for w, s in spread.items() if s))
    table = "\n".join(lines)
    print(table)
    method.write(os.path.join(args.out, "profile_overhead.json"), comparisons,
                 times=times, events=events, off_spread=spread, rounds=args.rounds)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4))
        names = list(comparisons)
        med, err = method.error_bars([comparisons[n] for n in names])
        ax.barh(names, med, xerr=err)
        ax.axvline(1.0, color="k", lw=1)
        ax.set_xlabel("time with recording / time without (same round)")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "profile_overhead.png"), dpi=110)
    except ImportError:
        print("(no matplotlib: no plot)")


if __name__ == "__main__":
    main()
