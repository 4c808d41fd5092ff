"""Session 15 probe for (g): a generated token's time, split where the link
works and where it cannot.

    PYTHONPATH=$PWD python3 <this> in_place|prefetch|prefetch_ahead2|prefetch_ahead4

One generate of benchmarks/offload_generate.py's model under its budget.
CUDA events on the compute stream at each forward's start, at its first
resident submodule and at its end split a token's GPU time into: the
streamed part (the link's), the resident tail, and the boundary (HF's
sampling kernels and the host's work between forwards, while the GPU waits
for the next forward's first kernels). Host times beside them.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_uvm  # noqa: E402

MiB = 1 << 20


def main(mode):
    import offload_generate as og
    torch_uvm.set_enabled_uvm(True)
    model = og.gpt2()
    ids = torch.randint(0, model.config.vocab_size, (1, og.PROMPT),
                        generator=torch.Generator().manual_seed(1)).cuda()
    ahead = int(mode.split("ahead")[1]) if "ahead" in mode else 1
    handle = torch_uvm.offload(model, budget=og.GEN_BUDGET, device="cuda",
                               mode="prefetch" if mode.startswith("prefetch") else "in_place",
                               ahead=ahead)

    def run():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=og.NEW_TOKENS,
                                  min_new_tokens=og.NEW_TOKENS, do_sample=False, pad_token_id=0)
    run()
    torch.cuda.synchronize()
    resident = handle.resident_units()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    streamed = weights - sum(u.nbytes for u in resident)
    marks = []   # (kind, cuda event, host time)

    def mark(kind):
        def hook(*_):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            marks.append((kind, e, time.perf_counter()))
        return hook
    hooks = [model.register_forward_pre_hook(mark("start")),
             model.register_forward_hook(mark("end"))]
    if resident:
        first = model.get_submodule(resident[0].name)
        hooks.append(first.register_forward_pre_hook(mark("resident")))
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    tokens = []
    starts = [i for i, m in enumerate(marks) if m[0] == "start"]
    for a, b in zip(starts, starts[1:]):
        one = {m[0]: m for m in marks[a:b]}
        nxt = marks[b]
        s, r, e = one["start"], one.get("resident", one["end"]), one["end"]
        tokens.append({
            "streamed": s[1].elapsed_time(r[1]),
            "resident": r[1].elapsed_time(e[1]),
            "boundary": e[1].elapsed_time(nxt[1]),
            "host_forward": (e[2] - s[2]) * 1e3,
            "host_between": (nxt[2] - e[2]) * 1e3,
        })
    tokens = tokens[1:]  # the first is the prompt's
    med = {k: statistics.median(t[k] for t in tokens) for k in tokens[0]}
    total = med["streamed"] + med["resident"] + med["boundary"]
    print(f"{mode}: {og.NEW_TOKENS / wall:.1f} tokens/s ({wall / og.NEW_TOKENS * 1e3:.1f} ms a "
          f"token); streamed {streamed / MiB:.0f} MiB a token, {len(resident)} of "
          f"{len(handle.units)} submodules resident")
    print(f"  GPU, median of {len(tokens)} tokens: streamed part {med['streamed']:.2f} ms "
          f"({streamed / med['streamed'] / 1e6:.1f} GB/s), resident tail {med['resident']:.2f} ms, "
          f"boundary {med['boundary']:.2f} ms; sum {total:.2f} ms")
    print(f"  host: forward {med['host_forward']:.2f} ms, between forwards "
          f"{med['host_between']:.2f} ms")
    handle.undo()


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main(sys.argv[1])
