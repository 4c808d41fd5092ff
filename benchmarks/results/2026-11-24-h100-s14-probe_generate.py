"""Session 14 probe for (g): where a generated token's time goes.

    PYTHONPATH=$PWD python3 <this> mechanisms|in_place|prefetch|prefetch_small
    (PROBE_END=1 with a build patched to put prefetch's resident units last)

mechanisms: pinned copy H2D, kernels reading pinned host memory in place
(sum, and F.linear at one row over GPT-2's weight shapes), and both at once.
in_place / prefetch: one generate of benchmarks/offload_generate.py's model
under its budget, profiled; the compute stream's busy time, its gaps, the
long (in-place) kernels' rate, and the GPU memory the process holds.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_uvm  # noqa: E402
from torch_uvm import _C  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20


def timed(fn, reps=5, stream=None):
    s = stream or torch.cuda.current_stream()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(reps):
        a.record(s)
        fn()
        b.record(s)
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    return best


def mechanisms():
    torch_uvm.set_enabled_uvm(True)
    n = GiB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    t = timed(lambda: dev.copy_(host, non_blocking=True))
    print(f"pinned copy H2D 1 GiB: {n / t / 1e9:.1f} GB/s")
    inplace = _C.pinned_home(torch.zeros(n // 2, dtype=torch.float16), torch.device("cuda"))
    t = timed(lambda: inplace.sum())
    print(f"in place sum 1 GiB fp16: {n / t / 1e9:.1f} GB/s")
    shapes = {"c_attn": (6144, 2048), "attn.c_proj": (2048, 2048), "c_fc": (8192, 2048),
              "mlp.c_proj": (2048, 8192)}
    weights = []
    for name, (o, i) in shapes.items():
        w = _C.pinned_home(torch.randn(o, i, dtype=torch.float16) * 0.02, torch.device("cuda"))
        x = torch.randn(1, i, dtype=torch.float16, device="cuda")
        t = timed(lambda: F.linear(x, w), reps=10)
        print(f"in place F.linear 1 row, {name} {o}x{i} ({w.nbytes / MiB:.0f} MiB): "
              f"{w.nbytes / t / 1e9:.1f} GB/s")
        weights.append((x, w))
    # a layer's worth, repeated to ~1 GiB: the in-place work of a token
    per_layer = sum(w.nbytes for _, w in weights)
    layers = max(1, GiB // per_layer)

    def token():
        for _ in range(layers):
            for x, w in weights:
                F.linear(x, w)
    t_in = timed(token, reps=3)
    print(f"in place, {layers} layers' GEMVs ({layers * per_layer / MiB:.0f} MiB): "
          f"{layers * per_layer / t_in / 1e9:.1f} GB/s, {t_in * 1e3:.1f} ms")
    side = torch.cuda.Stream()
    part = 256 * MiB
    t_cp = timed(lambda: dev[:part].copy_(host[:part], non_blocking=True), reps=3)
    print(f"pinned copy {part // MiB} MiB alone: {t_cp * 1e3:.1f} ms ({part / t_cp / 1e9:.1f} GB/s)")
    for share in (64 * MiB, 128 * MiB, 256 * MiB):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            dev[:share].copy_(host[:share], non_blocking=True)
        token()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        moved = layers * per_layer + share
        print(f"both at once, GEMVs + a {share // MiB} MiB copy: {wall * 1e3:.1f} ms, "
              f"{moved / wall / 1e9:.1f} GB/s together (GEMVs alone {t_in * 1e3:.1f} ms)")


def analyse(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    by_stream = {}
    for e in gpu:
        by_stream.setdefault(e.get("args", {}).get("stream"), []).append(e)
    compute = max(by_stream, key=lambda s: sum(e["dur"] for e in by_stream[s] if e["cat"] == "kernel"))
    ks = sorted(by_stream[compute], key=lambda e: e["ts"])
    span = (ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]) / 1e3
    busy, gaps, end = 0.0, [], ks[0]["ts"]
    for e in ks:
        if e["ts"] > end:
            gaps.append((e["ts"] - end) / 1e3)
        busy += e["dur"] / 1e3
        end = max(end, e["ts"] + e["dur"])
    long = [e for e in ks if e["dur"] > 130]
    copies = [e for e in gpu if e["cat"] == "gpu_memcpy"]
    if copies:
        cs = max({e.get("args", {}).get("stream") for e in copies},
                 key=lambda s: sum(e["dur"] for e in copies if e.get("args", {}).get("stream") == s))
        cp = sorted((e for e in copies if e.get("args", {}).get("stream") == cs), key=lambda e: e["ts"])
        cgaps, cend = [], cp[0]["ts"]
        for e in cp:
            if e["ts"] > cend:
                cgaps.append((e["ts"] - cend) / 1e3)
            cend = max(cend, e["ts"] + e["dur"])
        print(f"copy stream {cs}: {len(cp)} copies, busy {sum(e['dur'] for e in cp) / 1e3:.1f} ms, "
              f"gaps {sum(cgaps):.1f} ms ({len(cgaps)}); gaps 20-300 us: "
              f"{sum(g for g in cgaps if 0.02 < g < 0.3):.1f} ms in "
              f"{sum(1 for g in cgaps if 0.02 < g < 0.3)}; gaps >= 0.3 ms: "
              f"{sum(g for g in cgaps if g >= 0.3):.1f} ms in {sum(1 for g in cgaps if g >= 0.3)}")
    print(f"compute stream {compute}: span {span:.1f} ms, kernels {busy:.1f} ms "
          f"({len(ks)}), gaps {sum(gaps):.1f} ms; gaps > 0.2 ms: "
          f"{sum(g for g in gaps if g > 0.2):.1f} ms in {sum(1 for g in gaps if g > 0.2)}; "
          f"long kernels (> 130 us) {sum(e['dur'] for e in long) / 1e3:.1f} ms ({len(long)})")
    big = sorted(gaps, reverse=True)[:8]
    print("  largest gaps (ms):", ", ".join(f"{g:.2f}" for g in big))
    names = {}
    for e in long:
        n = names.setdefault(e["name"][:60], [0, 0.0])
        n[0] += 1
        n[1] += e["dur"] / 1e3
    for n, (c, ms) in sorted(names.items(), key=lambda kv: -kv[1][1])[:5]:
        print(f"  long: {c} x {n}: {ms:.1f} ms")
    for s, es in by_stream.items():
        if s == compute:
            continue
        print(f"  stream {s}: {len(es)} events, {sum(e['dur'] for e in es) / 1e3:.1f} ms")
    return span, sum(e["dur"] for e in long) / 1e3


def generate(mode):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import offload_generate as og
    torch_uvm.set_enabled_uvm(True)
    model = og.gpt2()
    ids = torch.randint(0, model.config.vocab_size, (1, og.PROMPT),
                        generator=torch.Generator().manual_seed(1)).cuda()
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    if "small" in mode:  # the window sized by the largest streamed unit (c_fc), not wte
        off = sys.modules["torch_uvm.offload"]
        largest_streamed = model.transformer.h[0].mlp.c_fc.weight.nbytes + \
            model.transformer.h[0].mlp.c_fc.bias.nbytes
        off.window_bytes = lambda mode, training, ahead, largest: (ahead + 1) * largest_streamed
    handle = torch_uvm.offload(model, budget=og.GEN_BUDGET, device="cuda",
                               mode="prefetch" if mode.startswith("prefetch") else "auto",
                               ahead=2 if mode.endswith("ahead2") else 1)

    def run():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=og.NEW_TOKENS, min_new_tokens=og.NEW_TOKENS,
                                  do_sample=False, pad_token_id=0)
    run()
    torch.cuda.synchronize()
    host = []   # each forward's host time, pre-hook to hook (no sync inside)
    starts = []
    pre = model.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))
    post = model.register_forward_hook(lambda *_: host.append(time.perf_counter() - starts[-1]))
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    pre.remove()
    post.remove()
    print(f"  host: {len(host)} forwards, {sum(host) / len(host) * 1e3:.2f} ms each on the host "
          f"(median {sorted(host)[len(host) // 2] * 1e3:.2f}); wall {wall / len(host) * 1e3:.2f} ms "
          f"a forward")
    held = free0 - torch.cuda.mem_get_info()[0]
    resident = handle.resident_units()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    streamed = weights - sum(u.nbytes for u in resident)
    print(f"{mode}: {og.NEW_TOKENS / wall:.1f} tokens/s, {wall / og.NEW_TOKENS * 1e3:.1f} ms a token; "
          f"streamed {streamed / MiB:.0f} MiB a token; GPU memory held beyond the start "
          f"{held / MiB:.0f} MiB (budget {og.GEN_BUDGET / MiB:.0f}); share peak "
          f"{handle.residency_stats()['resident_bytes.peak'] / MiB:.0f} MiB")
    print("  first resident:", resident[0].name if resident else None, "last:",
          resident[-1].name if resident else None, len(resident), "of", len(handle.units))
    from torch.profiler import ProfilerActivity, profile
    path = f"/tmp/gen_{mode}.json"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    span, long_ms = analyse(path)
    if long_ms:
        print(f"  per token: {span / og.NEW_TOKENS:.2f} ms span; long kernels "
          f"{long_ms / og.NEW_TOKENS:.2f} ms -> {streamed / (long_ms / og.NEW_TOKENS / 1e3) / 1e9:.1f} "
          f"GB/s if they read the streamed bytes")


if __name__ == "__main__":
    what = sys.argv[1]
    mechanisms() if what == "mechanisms" else generate(what)
