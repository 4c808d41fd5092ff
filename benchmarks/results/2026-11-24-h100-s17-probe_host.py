"""Session 17 probe for (g): where the host's time goes in a generated token.

    PYTHONPATH=$PWD python3 <this> in_place|prefetch [profile]

One generate of benchmarks/offload_generate.py's model under its budget,
after a warm-up generate. Prints tokens/s and the host's time per forward;
with `profile`, torch.profiler's CPU table (self time by op, CUDA runtime
calls and torch_uvm's own ranges included) over the timed generate.
Run under `py-spy record --native --format raw` for the stacks.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_uvm  # noqa: E402


def main(mode, profile, timing):
    import offload_generate as og
    torch_uvm.set_enabled_uvm(True)
    model = og.gpt2()
    ids = torch.randint(0, model.config.vocab_size, (1, og.PROMPT),
                        generator=torch.Generator().manual_seed(1)).cuda()
    handle = torch_uvm.offload(model, budget=og.GEN_BUDGET, device="cuda", mode=mode)

    def run():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=og.NEW_TOKENS,
                                  min_new_tokens=og.NEW_TOKENS, do_sample=False, pad_token_id=0)
    run()
    torch.cuda.synchronize()
    spent = timed_hooks() if timing else None
    host = []
    t = {}
    hooks = [model.register_forward_pre_hook(lambda *_: t.__setitem__("s", time.perf_counter())),
             model.register_forward_hook(lambda *_: host.append(time.perf_counter() - t["s"]))]
    prof = None
    if profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
    for h in hooks:
        h.remove()
    if spent:
        for k, v in spent.items():
            v.sort()
            print(f"  {k}: {len(v)} calls, median {v[len(v) // 2] / 1e3:.1f} us, "
                  f"p90 {v[len(v) * 9 // 10] / 1e3:.1f} us, sum {sum(v) / 1e6 / 32:.2f} ms a token")
    host.sort()
    print(f"{mode}: {og.NEW_TOKENS / wall:.1f} tokens/s ({wall / og.NEW_TOKENS * 1e3:.1f} ms a token), "
          f"host forward median {host[len(host) // 2] * 1e3:.2f} ms, {len(handle.units)} submodules, "
          f"{len(handle.resident_units())} resident")
    if prof is not None:
        try:
            timeline(prof)
        except Exception:  # noqa: BLE001  (a probe: the table below still prints)
            import traceback
            traceback.print_exc()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=80))
        inside = {}   # what runs inside torch_uvm's bring ranges, by name: (calls, us)
        n = 0
        for e in prof.events():
            if not e.name.startswith("torch_uvm::bring"):
                continue
            n += 1
            stack = list(e.cpu_children)
            while stack:
                c = stack.pop()
                calls, us = inside.get(c.name.split(" ")[0], (0, 0.0))
                inside[c.name.split(" ")[0]] = (calls + 1, us + c.cpu_time_total)
                stack.extend(c.cpu_children)
        print(f"inside {n} brings (per bring: calls, total us incl. children):")
        for name, (calls, us) in sorted(inside.items(), key=lambda kv: -kv[1][1]):
            print(f"  {name:50s} {calls / n:6.2f} {us / n:8.2f}")
    handle.undo()


def union(spans):
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def timeline(prof):
    """The link's copy engine over the profiled generate: busy, and its gaps
    split into the host issuing the next copy late and the copy waiting for
    a stream (its slot's earlier readers)."""
    ev = list(prof.profiler.kineto_results.events())
    copies = sorted((e for e in ev if "Memcpy HtoD" in e.name()), key=lambda e: e.start_ns())
    kernels = [(e.start_ns(), e.end_ns()) for e in ev if e.activity_type() == "kernel"
               or (e.device_type() == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name()
                   and "Memset" not in e.name())]
    calls = {e.correlation_id(): e for e in ev if e.name() == "cudaMemcpyAsync"}
    print(f"activity types: {sorted(set(str(e.activity_type()) for e in ev))[:12]}")
    if not copies:
        print("no HtoD copies seen")
        return
    t0, t1 = copies[0].start_ns(), copies[-1].end_ns()
    busy = union([(c.start_ns(), c.end_ns()) for c in copies])
    kbusy = union([k for k in kernels if t0 <= k[0] <= t1])
    late = dep = big = 0
    gaps = []
    for a, b in zip(copies, copies[1:]):
        gap = b.start_ns() - a.end_ns()
        if gap <= 2000:
            continue
        call = calls.get(b.correlation_id())
        issued = call.end_ns() if call is not None else a.end_ns()
        h = max(0, min(issued, b.start_ns()) - a.end_ns())
        late += h
        dep += gap - h
        gaps.append((gap, h, a.name(), b.nbytes() if hasattr(b, "nbytes") else 0))
        if gap > 500000:
            big += gap
    span = t1 - t0
    print(f"copy engine over {span / 1e6:.1f} ms: busy {busy / 1e6:.1f} ms ({busy / span:.1%}); "
          f"compute busy {kbusy / 1e6:.1f} ms; gaps >2us: {len(gaps)}, host late {late / 1e6:.2f} ms, "
          f"waiting on a stream {dep / 1e6:.2f} ms (of which gaps >0.5 ms {big / 1e6:.2f} ms); "
          f"matched calls {sum(1 for c in copies if c.correlation_id() in calls)}/{len(copies)}")
    gaps.sort(reverse=True)
    for g in gaps[:12]:
        print(f"   gap {g[0] / 1e3:8.1f} us, host late {g[1] / 1e3:8.1f} us")
    hist = {}
    for g in gaps:
        k = "<20us" if g[0] < 2e4 else "<100us" if g[0] < 1e5 else "<500us" if g[0] < 5e5 else ">=500us"
        n, t, h = hist.get(k, (0, 0, 0))
        hist[k] = (n + 1, t + g[0], h + g[1])
    for k, (n, t, h) in hist.items():
        print(f"   {k:8s} {n:5d} gaps, {t / 1e6:7.2f} ms, host late {h / 1e6:7.2f} ms")


def timed_hooks():
    """Host time of the executor's before/after for each submodule, without a profiler."""
    import collections
    off = sys.modules["torch_uvm.offload"]
    spent = collections.defaultdict(list)
    pre, post = off.Offloaded._pre, off.Offloaded._post

    def _pre(self, unit, args):
        t = time.perf_counter_ns()
        pre(self, unit, args)
        kind = "resident" if self.executor.resident(unit.index) else "streamed"
        spent["before " + kind].append(time.perf_counter_ns() - t)

    def _post(self, unit, output=None):
        t = time.perf_counter_ns()
        post(self, unit, output)
        kind = "resident" if self.executor.resident(unit.index) else "streamed"
        spent["after " + kind].append(time.perf_counter_ns() - t)
    off.Offloaded._pre, off.Offloaded._post = _pre, _post
    return spent


if __name__ == "__main__":
    main(sys.argv[1], "profile" in sys.argv[2:], "timing" in sys.argv[2:])
