"""Activations in a fixed GPU memory (issue 35, point 4): a training step of
a Llama-architecture model against sequence length, its saved activations
sent to host memory during forward and brought back during backward, by
torch_uvm.offload_activations, PyTorch's save_on_cpu and torchtune's
OffloadActivations, beside the step without offload.

    python benchmarks/offload_activations.py [--rounds 2] [--only full,checkpointed]
        [--seqs 8192,16384] [--variants a,b] [--tiny] [--out DIR]

The model: offload_llama's 7B shapes (hidden 4096, intermediate 11008, 32
heads, vocabulary 32000) with 8 decoder layers: 1.95 G parameters, random
bf16, all trainable, resident on the GPU (the weights are not what this
measures). A step: forward of batch 1 at the sequence length with the
causal LM loss (SDPA attention), backward, gradients set to None; no
optimizer. Two scenarios: `full` (every layer's activations saved) and
`checkpointed` (HF's activation checkpointing, reentrant: each layer's
input is saved through the hooks and the rest recomputed).

Variants, each in a fresh process, interleaved round by round; each runs the
sequence lengths in ascending order, one warm-up and three timed steps each
(the median counts), and stops at the first that does not fit:
- pinned_rate: 1 GiB pinned copies, the link's rate for this round.
- resident: no offload, no cap: the compute of the step at every length.
- resident_capped: no offload, PyTorch's allocator capped at CAP_GIB (the
  fixed GPU memory): the longest sequence a GPU of that size trains.
- torch_uvm: torch_uvm.offload_activations() (1 MiB and larger, a 512 MiB
  window), capped.
- torch_uvm_8GiB: the same with budget=8 GiB: the last 8 GiB of saved
  activations a forward makes stay on the GPU.
- save_on_cpu: torch.autograd.graph.save_on_cpu(pin_memory=True), capped.
- torchtune: torchtune's OffloadActivations (its defaults: pinned, a copy
  stream, a stash of 5), capped; its file is loaded from the installed
  torchtune wheel without the package's other imports.

The link: S is the bytes of saved activations of 1 MiB and more
(deduplicated) a step makes, what torch_uvm without a budget sends (its
stats). Where B of them may stay on the GPU, at least L = S - B must go
home and come back, so a step's copies take L/d2h + L/h2d at the least
(B = 0 for the anchors); "covered" says where resident's step is at least
that long (compute can hide the copies), and there the target is a
torch_uvm step ≤ 1.2× resident's.

Beside every figure: the process's GPU memory (mem_get_info, sampled;
offload_llama.GpuMemory) over the timed steps, PyTorch's reserved peak, and
the host's peak (ru_maxrss). Gradients: the norm of all gradients after the
first timed step, against resident's (SDPA's and cuBLAS's backward need not
be deterministic; OFFLOAD_DETERMINISTIC=1 asks for deterministic kernels).

--tiny runs a 2-layer, hidden-256 Llama at short lengths, in seconds."""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import method  # noqa: E402
from method import gib_cell, median_cell  # noqa: E402
import offload_llama  # noqa: E402

GiB = 1 << 30
LAYERS = 8
CAP_GIB = 24
SEQS = {"full": (2048, 4096, 8192, 16384), "checkpointed": (8192, 16384, 32768)}
TINY_SEQS = (64, 128, 256)
TIMED = 3
BUDGET_GIB = 8
VARIANTS = ["pinned_rate", "resident", "resident_capped", "torch_uvm",
            f"torch_uvm_{BUDGET_GIB}GiB", "save_on_cpu", "torchtune"]
CAPPED = VARIANTS[2:]


def torchtune_offload_activations():
    """torchtune's OffloadActivations class, from its installed file, with
    the three names it imports for other uses (NF4Tensor, TiedLinear,
    get_logger) given stand-ins, so none of torchtune's other modules (and
    their dependencies) load."""
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torchtune is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "training",
                        "_activation_offloading.py")
    stubs = {"torchtune": types.ModuleType("torchtune"),
             "torchtune.modules": types.SimpleNamespace(TiedLinear=type("TiedLinear", (), {})),
             "torchtune.utils": types.SimpleNamespace(get_logger=logging.getLogger),
             "torchao": types.SimpleNamespace(__version__="0"),
             "torchao.dtypes": types.ModuleType("torchao.dtypes"),
             "torchao.dtypes.nf4tensor": types.SimpleNamespace(
                 NF4Tensor=type("NF4Tensor", (), {}))}
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        loader = importlib.util.spec_from_file_location("torchtune_activation_offloading", path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module.OffloadActivations


def activation_budget(variant: str, tiny: bool = False) -> int:
    """torch_uvm_<N>GiB: N GiB of saved activations may stay (--tiny: N MiB)."""
    gib = method.variant_gib(variant)
    return 0 if gib is None else int(gib * (1 << (20 if tiny else 30)))


def hooks_for(variant: str, tiny: bool = False):
    """A factory of the variant's context around forward (--tiny: every
    saved tensor is large enough to send)."""
    import contextlib
    import torch
    if variant.startswith("torch_uvm"):
        import torch_uvm
        ctx = torch_uvm.offload_activations(min_bytes=0 if tiny else 1 << 20,
                                            budget=activation_budget(variant, tiny))
        return lambda: ctx
    if variant == "save_on_cpu":
        return lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)
    if variant == "torchtune":
        cls = torchtune_offload_activations()
        return cls        # a new one a step, as its recipes make it around each forward
    return contextlib.nullcontext


def run_variant(variant: str, tiny: bool, scenario: str = "full", seqs=None) -> dict:
    if variant == "pinned_rate":
        return method.pinned_rate()
    import torch
    method.deterministic_kernels()
    gpu = offload_llama.GpuMemory()
    seqs = seqs or (TINY_SEQS if tiny else SEQS[scenario])
    model = offload_llama.build(tiny, num_hidden_layers=2 if tiny else LAYERS,
                                max_position_embeddings=max(seqs)).cuda().train()
    if scenario == "checkpointed":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()     # reentrant checkpointing needs a grad-requiring input
    out = {"weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "seqs": {}, "cap_bytes": None, "activation_budget_bytes": activation_budget(variant, tiny)}
    if variant in CAPPED:
        cap = (1 if tiny else CAP_GIB) * GiB
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
        out["cap_bytes"] = cap
    hooks = hooks_for(variant, tiny)
    vocab = model.config.vocab_size

    def step(ids) -> float:
        with hooks() as h:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item(), h

    for seq in seqs:
        ids = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(seq)).cuda()
        row = {}
        try:
            step(ids)                                  # warm-up: homes pinned, plans made
            model.zero_grad(set_to_none=True)
            torch.cuda.reset_peak_memory_stats()
            gpu.start(str(seq))
            times, losses = [], []
            for i in range(TIMED):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss, h = step(ids)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                losses.append(loss)
                if i == 0:
                    grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
                    row["grad_norm"] = torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
                    del grads
                    if variant.startswith("torch_uvm"):
                        before = dict(h.stats())
                model.zero_grad(set_to_none=True)
            s = sorted(times)[len(times) // 2]
            row.update(s_per_step=s, times_s=times, tokens_per_s=seq / s, losses=losses,
                       gpu_peak_timed_bytes=gpu.peak(str(seq)),
                       torch_reserved_peak_bytes=torch.cuda.max_memory_reserved())
            if variant.startswith("torch_uvm"):
                after = h.stats()
                row["offload_stats_per_step"] = {
                    k: (after.get(k, 0) - before.get(k, 0)) / (TIMED - 1) for k in after}
                row["sent_bytes_per_step"] = row["offload_stats_per_step"].get("sent_bytes", 0)
        except torch.OutOfMemoryError as e:
            row = {"oom": str(e).splitlines()[0][:300]}
            out["seqs"][str(seq)] = row
            print(f"seq {seq}: out of memory", flush=True)
            break
        out["seqs"][str(seq)] = row
        print(f"seq {seq}: {row['tokens_per_s']:.0f} tokens/s, "
              f"{gib_cell(row['gpu_peak_timed_bytes'])} GiB", flush=True)
    out["host_peak_bytes"] = method.host_peak_bytes()
    gpu.stop()
    return out


# ---------------------------------------------------------------- the report

def report(runs: dict, out_dir: str, tiny: bool, scenario: str = "full", seqs=None) -> dict:
    """Prints the table and the ratios; writes the JSON and the plot."""
    rates = runs.get("pinned_rate", [])
    rounds = max(len(rs) for rs in runs.values())
    h2d = [r["h2d_gbps"] * 1e9 if r else None for r in rates] + [None] * rounds
    d2h = [r["d2h_gbps"] * 1e9 if r else None for r in rates] + [None] * rounds
    seqs = seqs or (TINY_SEQS if tiny else SEQS[scenario])
    some = next((r for v, rs in runs.items() if v != "pinned_rate" for r in rs if r), None)
    cap = next((r["cap_bytes"] for v, rs in runs.items() for r in rs if r and r.get("cap_bytes")),
               None)
    print(f"\nLlama-architecture {'tiny' if tiny else '7B-shape'}, {2 if tiny else LAYERS} layers "
          f"({gib_cell(some and some['weights_bytes'])} GiB bf16, resident), batch 1, "
          f"{scenario}; capped variants at {gib_cell(cap)} GiB of PyTorch's allocator; pinned "
          f"H2D {median_cell(method.summarize([r['h2d_gbps'] for r in rates if r]), '.1f')} / "
          f"D2H {median_cell(method.summarize([r['d2h_gbps'] for r in rates if r]), '.1f')} GB/s")
    print("| variant | sequence | tokens/s (median, min–max) | x resident's step | least to "
          "send, GiB (sent) | its copies' least time, s (covered by resident's compute) | "
          "gradient norm - resident's | process GPU, GiB | torch reserved peak, GiB | host "
          "peak, GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tables, compared = {}, {}
    uvm = runs.get("torch_uvm", [])
    for v, rs in runs.items():
        if v == "pinned_rate":
            continue
        rs = list(rs) + [None] * (rounds - len(rs))
        for seq in map(str, seqs):
            ok = [r for r in rs if r and seq in r["seqs"]]
            if not ok:
                continue
            if any("oom" in r["seqs"][seq] for r in ok):
                print(f"| {v} | {seq} | out of memory | | | | | | | |")
                tables[f"{v}, {seq}"] = {"oom": True}
                continue
            secs = [r["seqs"][seq]["s_per_step"] if r and seq in r["seqs"] and
                    "s_per_step" in r["seqs"][seq] else None for r in rs]
            res = [r["seqs"][seq].get("s_per_step") if r and seq in r["seqs"] else None
                   for r in runs.get("resident", [])]
            saved = next((r["seqs"][seq].get("sent_bytes_per_step") for r in uvm
                          if r and seq in r["seqs"]), None)
            least = None if saved is None else \
                max(0, saved - ok[0].get("activation_budget_bytes", 0))
            sent = ok[0]["seqs"][seq].get("sent_bytes_per_step")
            link = [least / a + least / b if least is not None and a and b else None
                    for a, b in zip(d2h[:rounds], h2d[:rounds])]
            covered = None
            if res and any(res) and any(x is not None for x in link):
                covered = method.summarize([x for x in res if x])["median"] >= \
                    method.summarize([x for x in link if x is not None])["median"]
            norm = next((r["seqs"][seq].get("grad_norm") for r in runs.get("resident", [])
                         if r and seq in r["seqs"]), None)
            mine = v.startswith("torch_uvm")
            x_res = method.ratio(secs, res, target=1.2 if mine and covered else None) \
                if v != "resident" else None
            row = {"tokens_per_s": method.summarize([int(seq) / s for s in secs if s]),
                   "s_per_step": method.summarize([s for s in secs if s]),
                   "x_resident": x_res, "least_bytes_per_step": least,
                   "sent_bytes_per_step": sent,
                   "link_s": method.summarize([x for x in link if x is not None]),
                   "covered": covered,
                   "grad_norm_minus_resident": None if norm is None else max(
                       abs(r["seqs"][seq]["grad_norm"] - norm) for r in ok),
                   **{k: max(r["seqs"][seq][k] for r in ok)
                      for k in ("gpu_peak_timed_bytes", "torch_reserved_peak_bytes")},
                   "host_peak_bytes": max(r["host_peak_bytes"] for r in ok)}
            tables[f"{v}, {seq}"] = row
            t = row["tokens_per_s"]
            print(f"| {v} | {seq} | {t['median']:.0f} ({t['min']:.0f}–{t['max']:.0f}) | "
                  f"{median_cell(x_res)} | {gib_cell(least)} ({gib_cell(sent)}) | "
                  f"{median_cell(row['link_s'], '.3f')} ({'—' if covered is None else covered}) | "
                  f"{'—' if row['grad_norm_minus_resident'] is None else format(row['grad_norm_minus_resident'], '.2g')} | "
                  f"{gib_cell(row['gpu_peak_timed_bytes'])} | "
                  f"{gib_cell(row['torch_reserved_peak_bytes'])} | "
                  f"{gib_cell(row['host_peak_bytes'])} |")
            if mine and x_res:
                compared[f"{v}, {seq}: s per step / resident's"] = x_res
            if mine:
                for anchor in ("save_on_cpu", "torchtune"):
                    theirs = [r["seqs"][seq].get("s_per_step") if r and seq in r["seqs"] else None
                              for r in runs.get(anchor, [])]
                    if any(theirs):
                        compared[f"{v}, {seq}: s per step / {anchor}'s"] = method.ratio(
                            secs, theirs)
    method.print_comparisons(compared)
    os.makedirs(out_dir, exist_ok=True)
    stem = f"offload_activations_{scenario}" + ("_tiny" if tiny else "")
    method.write(os.path.join(out_dir, stem + ".json"), compared, runs=runs, tables=tables,
                 tiny=tiny, scenario=scenario, seqs=list(seqs), cap_bytes=cap, layers=LAYERS)
    plot(tables, os.path.join(out_dir, stem + ".png"), seqs, cap, scenario)
    return compared


def plot(tables: dict, path: str, seqs, cap, scenario: str) -> None:
    """Tokens/s and the process's GPU memory against sequence length, a line
    per variant; the cap as a dashed line."""
    plt = method.pyplot()
    if plt is None:
        return
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = sorted({k.rsplit(", ", 1)[0] for k in tables})
    for name in names:
        pts = [(int(s), tables[f"{name}, {s}"]) for s in map(str, seqs)
               if f"{name}, {s}" in tables and not tables[f"{name}, {s}"].get("oom")]
        if not pts:
            continue
        xs = [x for x, _ in pts]
        med, err = method.error_bars([row["tokens_per_s"] for _, row in pts])
        speed.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=name)
        memory.plot(xs, [row["gpu_peak_timed_bytes"] / GiB for _, row in pts], marker="o",
                    label=name)
    if cap:
        memory.axhline(cap / GiB, color="k", ls="--", lw=0.8, label="cap")
    for ax, label in ((speed, "tokens/s"), (memory, "process GPU memory, GiB (mem_get_info)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (batch 1)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle(f"Activation offload, Llama 7B-shape x {LAYERS} layers, {scenario}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    import argparse
    ap = method.driver_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]),
                            rounds=2, only="full,checkpointed")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results"))
    ap.add_argument("--tiny", nargs="?", const=1, default=0, type=int)
    ap.add_argument("--seqs", default="", help="sequence lengths (comma-separated) instead of "
                    "the scenario's")
    args = ap.parse_args(argv)
    seqs = [int(x) for x in args.seqs.split(",") if x] or None
    if args.variant:
        import json
        print("RESULT " + json.dumps(run_variant(args.variant, bool(args.tiny),
                                                 args.scenario or "full", seqs)), flush=True)
        return
    plan = {s: list(VARIANTS) for s in SEQS}
    scenarios = method.chosen(plan, args.only, args.variants)
    t0 = time.time()
    for scenario in scenarios:
        runs = method.interleaved(plan[scenario], args.rounds, lambda v: method.spawn(
            os.path.abspath(__file__), timeout=600, variant=v, scenario=scenario,
            tiny=int(args.tiny), seqs=args.seqs),
            after_round=lambda so_far, done: done < args.rounds and report(   # a cut run keeps
                so_far, args.out, bool(args.tiny), scenario, seqs))           # its rounds
        report(runs, args.out, bool(args.tiny), scenario, seqs)
    print(f"\n{len(scenarios)} scenarios x {args.rounds} rounds in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
