"""Larger than the GPU, (g): generation with a model twice its budget, side by
side with the anchors, against the link's limit measured in the same run.

    python benchmarks/offload_generate.py [--rounds 2] [--out DIR]

A random-init GPT-2-style model (n_embd 2048, 30 layers, about 3 GiB fp16)
generates 32 tokens greedily from a 32-token prompt under a 1.5 GiB budget:
all resident; torch_uvm.offload in its auto mode (at batch 1 whichever of
in place and prefetch moves the streamed bytes sooner: prefetch for this
model), in place (_in_place) and in prefetch mode (streamed layers copied
into GPU memory one submodule ahead, or two: _ahead2); accelerate
dispatch_model with the same GPU share; and torch_uvm_bound_<G>GiB,
offload(gpu_memory=G GiB), a bound on the whole process within which
torch_uvm chooses the budget (its whole peak reported beside the bound). Tokens/s; every run's tokens are
checked equal to all-resident's (which every run includes).

The link limit is the least any placement must move: each token reads every
weight once, and a budget B holds at most B bytes of the W bytes of weights,
so W - B bytes cross to the GPU per token whatever the plan, and tokens/s <=
pinned H2D rate / (W - B) (headline, target 0.85). The bytes torch_uvm's own
plan streams per token (more: what it keeps resident is whole units) are a
second, labeled column; a ratio against them would flatter the plan. The
pinned rate is measured by its own variant in every round (1 GiB pinned
copies), so the limit and the runs share the machine's state.

Beside every figure, the process's GPU memory as the driver sees it
(method.ProcessGpuMemory: peak of mem_get_info's used bytes over a baseline
taken after CUDA's context), apart from torch_uvm's books.

Each variant in a fresh process, variants interleaved round by round.
Writes offload_generate.json and .png to --out.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torch_uvm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # method
import method  # noqa: E402
import offload_llama  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
GEN_BUDGET, PROMPT, NEW_TOKENS = 3 * GiB // 2, 32, 32
PLAN = {"generate": ["pinned_rate", "resident", "torch_uvm_offload", "torch_uvm_offload_in_place",
                     "torch_uvm_offload_prefetch",
                     "torch_uvm_offload_prefetch_ahead2", "accelerate_dispatch",
                     "torch_uvm_bound_2GiB"]}


def gpt2(config=None, fill: str = None):
    """The model in fp16 on the CPU, without an fp32 copy: made on the meta
    device, given storage by to_empty, its tied head tied again, and filled
    in place by offload_llama.fill_weights, drawn on `fill` (default the
    GPU if there is one: faster): layer norms' weights ones, vectors zeros,
    matrices N(0, 0.02). Made in fp32 and cast, the host held 6 GiB for a
    moment, so the run's host peak was the build's, not the offload's."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    config = config or GPT2Config(n_embd=2048, n_layer=30, n_head=16, n_positions=1024)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    model = model.to(torch.float16).to_empty(device="cpu")
    model.tie_weights()
    if any(True for _ in model.buffers()):      # (none in transformers 5: each would be garbage)
        raise RuntimeError("offload_generate: this GPT-2 has buffers, which to_empty leaves "
                           "unset: build it another way")
    offload_llama.fill_weights(model, fill or ("cuda" if torch.cuda.is_available() else "cpu"),
                               ones=lambda name: name.endswith(".weight"))  # (layer norms')
    return model.eval()


def run_generate(variant):
    """One variant in this process: its result, with the process's GPU memory
    measured by the driver around everything that touches the GPU."""
    if variant == "pinned_rate":
        return method.pinned_rate()
    return method.with_process_gpu_memory(lambda: measure(variant),
                                          uvm=variant.startswith("torch_uvm"))


def measure(variant):
    import torch
    if variant.startswith("torch_uvm"):
        import torch_uvm
    model = gpt2()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1)).cuda()
    peak, extra, streamed = weights, {}, 0
    if variant == "resident":
        model.cuda()
    elif variant.startswith("torch_uvm_offload"):
        mode = "prefetch" if "_prefetch" in variant else \
            "in_place" if variant.endswith("_in_place") else "auto"
        handle = torch_uvm.offload(model, budget=GEN_BUDGET, device="cuda", mode=mode,
                                   ahead=2 if variant.endswith("_ahead2") else 1)
    elif variant.startswith("torch_uvm_bound_"):   # the budget chosen within the bound
        torch.cuda.empty_cache()      # (what building the model left cached is not the process's)
        bound = int(method.variant_bound_gib(variant) * GiB)
        handle = torch_uvm.offload(model, gpu_memory=bound, device="cuda", mode="auto",
                                   batch=1, seq=PROMPT + NEW_TOKENS)
        extra.update(bound_bytes=bound, budget_bytes=handle.state.bound.budget)
    elif variant == "accelerate_dispatch":
        from accelerate import dispatch_model
        per_block = sum(p.numel() * 2 for p in model.transformer.h[0].parameters())
        rest = weights - per_block * len(model.transformer.h)
        on_gpu = (GEN_BUDGET - rest) // per_block
        device_map = {"transformer.wte": 0, "transformer.wpe": 0, "transformer.ln_f": 0,
                      "lm_head": 0}
        device_map.update({f"transformer.h.{i}": 0 if i < on_gpu else "cpu"
                           for i in range(len(model.transformer.h))})
        dispatch_model(model, device_map=device_map, main_device=0)
        peak, extra = rest + on_gpu * per_block, {"blocks_on_gpu": int(on_gpu)}
        streamed = weights - peak

    def generate():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=False, pad_token_id=0)
    out = generate()                                      # warm-up (and learns the order)
    torch.cuda.synchronize()
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = generate()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    where = os.environ.get("OFFLOAD_PROFILE")   # a folder: one more generate, profiled
    if where and variant != "accelerate_dispatch":
        os.makedirs(where, exist_ok=True)
        extra["profile"] = method.profiled(generate, os.path.join(where, f"generate_{variant}.json"))
    if variant.startswith(("torch_uvm_offload", "torch_uvm_bound_")):
        s = handle.residency_stats()
        peak = s["resident_bytes.peak"]
        # the slots' device memory, measured apart from the budget's books
        stats = torch_uvm.memory_stats()
        extra["slot_bytes_peak"] = stats["slots.cuda:0.reserved_bytes.peak"]
        extra["slot_allocated_bytes_peak"] = stats["slots.cuda:0.allocated_bytes.peak"]
        resident = handle.resident_units()
        # torch_uvm's plan's own bytes per token: its units not resident (a
        # secondary column: the limit is the least any placement moves)
        streamed = weights - sum(u.nbytes for u in resident)
        extra.update(mode=handle.mode, resident_units=len(resident), units=len(handle.units),
                     resident_names=[u.name for u in resident])
    return {"tokens_per_s": NEW_TOKENS / min(times), "weights_bytes": weights,
            "peak_resident_bytes": peak, "streamed_bytes_per_token": streamed,
            "tokens": out[0, PROMPT:].tolist(), **extra}


LEAST = "the least any placement moves"


def rows(runs, rates):
    """Per variant: its tokens/s, the check of its tokens against all-resident's,
    its GPU memory, and its tokens/s against the two limits of each round."""
    ref = next((r["tokens"] for r in runs.get("resident", []) if r), None)
    tables = {}
    for v, rs in runs.items():
        ok = [r for r in rs if r]
        if v == "pinned_rate" or not ok:
            continue
        tokens = [r["tokens_per_s"] if r else None for r in rs]
        weights = ok[-1]["weights_bytes"]
        budget = ok[-1].get("budget_bytes") or GEN_BUDGET    # (a bound's: the one it chose)
        least = method.least_generation_bytes(weights, budget)
        plan = ok[-1]["streamed_bytes_per_token"]
        row = {**{k: ok[-1][k] for k in ok[-1] if k not in ("tokens", "process_gpu_memory")},
               "tokens_per_s": method.summarize([r["tokens_per_s"] for r in ok]),
               "outputs": method.outputs_check([r["tokens"] for r in ok], ref),
               "process_gpu_memory": [r.get("process_gpu_memory") for r in ok],
               "least_bytes_per_token": least}
        row["same_tokens"] = row["outputs"]["same"]
        if v != "resident":   # all-resident streams nothing: no link bounds it
            limits = [method.least_generation_limit(weights, budget, rate) if rate else None
                      for rate in rates]
            row["link_limit_tokens_per_s"] = method.summarize([x for x in limits if x])
            row["of_limit"] = method.ratio(tokens, limits, target=0.85, lower_is_better=False)
            if plan:
                own = [rate / plan if rate else None for rate in rates]
                row["plan_limit_tokens_per_s"] = method.summarize([x for x in own if x])
                row["of_plan_limit"] = method.ratio(tokens, own, lower_is_better=False)
        tables[v] = row
    return tables


def cell(summary, fmt=".1f"):
    return "—" if not summary else f"{summary['median']:{fmt}}"


def main():
    ap = method.driver_args(argparse.ArgumentParser(), rounds=2, only="generate")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(run_generate(args.variant)), flush=True)
        return
    method.chosen(PLAN, "generate", args.variants)
    runs = method.scenario_runs(os.path.abspath(__file__), PLAN, ["generate"], args.rounds,
                                timeout=400)["generate"]
    rates = method.round_rates(runs.get("pinned_rate", []), "h2d_gbps", args.rounds)
    tables = rows(runs, rates)
    measured = [r for r in rates if r]
    print(f"\n(g) GPT-2-style, n_embd 2048, 30 layers (~3 GiB fp16), {NEW_TOKENS} tokens from "
          f"a {PROMPT}-token prompt, budget {GEN_BUDGET / GiB:.1f} GiB; pinned H2D rate this run: "
          + (f"{method.summarize(measured)['median'] / 1e9:.1f} GB/s" if measured
             else "not measured (pinned_rate failed): no limits"))
    print(f"link limit = {LEAST}: the weights less the budget, per token, at the pinned H2D rate")
    print(f"| variant | tokens/s (median, min-max) | link limit ({LEAST}), tokens/s | "
          "of the limit | process GPU memory (peak, mem_get_info) | "
          "peak resident (slots' reserved peak, measured) | torch_uvm's plan streams / token "
          "(its limit, tokens/s; of it) | tokens = all resident |")
    print("|---|---|---|---|---|---|---|---|")
    for v, rs in runs.items():
        if v == "pinned_rate":
            continue
        if v not in tables:
            print(f"| {v} | failed | | | | | | |")
            continue
        t, row = tables[v]["tokens_per_s"], tables[v]
        slots = row.get("slot_bytes_peak")
        plan = row["streamed_bytes_per_token"]
        own = (f"{plan / MiB:.0f} MiB ({cell(row.get('plan_limit_tokens_per_s'))}; "
               f"{cell(row.get('of_plan_limit'), '.2f')})") if plan else "—"
        print(f"| {v} | {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | "
              f"{cell(row.get('link_limit_tokens_per_s'))} | {cell(row.get('of_limit'), '.2f')} | "
              f"{method.gpu_memory_cell(row['process_gpu_memory'])} | "
              f"{row['peak_resident_bytes'] / MiB:.0f} MiB"
              f"{f' ({slots / MiB:.0f})' if slots is not None else ''} | {own} | "
              f"{method.describe_check(row['outputs'])} |")
    for v, row in tables.items():
        if row.get("bound_bytes"):
            method.report_bound(row, [r for r in runs[v] if r])
    compared = {}
    for v, row in tables.items():
        if v.startswith("torch_uvm") and row.get("of_limit"):
            least = row["least_bytes_per_token"]
            compared[f"(g) {v}, tokens/s / link limit ({LEAST}: the weights less the "
                     f"budget, {least / MiB:.0f} MiB per token)"] = row["of_limit"]
        if v.startswith("torch_uvm") and row.get("of_plan_limit"):
            compared[f"(g) {v}, tokens/s / the limit of torch_uvm's plan's own streamed "
                     f"bytes (secondary)"] = row["of_plan_limit"]
    if "accelerate_dispatch" in runs and "torch_uvm_offload" in runs:
        compared["(g) accelerate dispatch_model / torch_uvm.offload, tokens/s"] = method.ratio(
            [r["tokens_per_s"] if r else None for r in runs["accelerate_dispatch"]],
            [r["tokens_per_s"] if r else None for r in runs["torch_uvm_offload"]],
            lower_is_better=False)
    for v, rs in runs.items():
        for r in rs:
            if r and r.get("profile"):
                print(method.describe_profile(f"(g) {v}", r["profile"]))
                break
    method.print_comparisons(compared)
    os.makedirs(args.out, exist_ok=True)
    method.write(os.path.join(args.out, "offload_generate.json"), compared, runs=runs,
                 tables=tables)
    plot(tables, os.path.join(args.out, "offload_generate.png"))


def plot(tables, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(tables)
    med, err = method.error_bars([tables[n]["tokens_per_s"] for n in names])
    ax.bar(names, med, yerr=err, capsize=4)
    lim = next((t["link_limit_tokens_per_s"] for t in tables.values()
                if t.get("link_limit_tokens_per_s")), None)
    if lim:
        ax.axhline(lim["median"], color="k", ls="--",
                   label=f"link limit: {LEAST} (weights − budget per token)")
        ax.legend()
    ax.set_ylabel("tokens/s")
    ax.tick_params(axis="x", rotation=20)
    ax.set_title("(g) generate, 3 GiB model, 1.5 GiB budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
