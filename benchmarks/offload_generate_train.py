"""Larger than the GPU (issue 10), (b) and (c): generation with a model
twice its budget, and training under a budget, side by side with the anchors.

    python benchmarks/offload_generate_train.py [--rounds 2] [--out DIR] [--only generate,train]

(b) generate: a random-init GPT-2-style model (n_embd 2048, 30 layers, about
    3 GiB fp16) generating 32 tokens greedily from a 32-token prompt under a
    1.5 GiB budget: all resident, torch_uvm.offload, accelerate dispatch_model
    with the same GPU share. Tokens/s; the tokens must equal all-resident's.
(c) train: an MLP of 32 fp32 Linear(4096, 4096) (2 GiB) with AdamW, batch
    256, under a 1 GiB budget, against all resident. Seconds per step; the
    losses must equal all-resident's, bit for bit.

Each variant in a fresh process, variants interleaved round by round.
Writes offload_generate_train.json and .png to --out.
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
GEN_BUDGET, PROMPT, NEW_TOKENS = 3 * GiB // 2, 32, 32
TRAIN_BUDGET, TRAIN_LAYERS, TRAIN_WIDTH, TRAIN_BATCH, TRAIN_STEPS = 1 * GiB, 32, 4096, 256, 4
PLAN = {"generate": ["resident", "torch_uvm_offload", "accelerate_dispatch"],
        "train": ["resident", "torch_uvm_offload"]}


def gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_embd=2048, n_layer=30, n_head=16, n_positions=1024)
    return GPT2LMHeadModel(config).half().eval()


def run_generate(variant):
    import torch
    if variant == "torch_uvm_offload":
        import torch_uvm
        torch_uvm.set_enabled_uvm(True)
    model = gpt2()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1)).cuda()
    peak, extra = weights, {}
    if variant == "resident":
        model.cuda()
    elif variant == "torch_uvm_offload":
        handle = torch_uvm.offload(model, budget=GEN_BUDGET, device="cuda")
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
    if variant == "torch_uvm_offload":
        s = torch_uvm.residency_stats()
        peak = s["resident_bytes.peak"]
        extra = {"mode": handle.mode, "resident_units": sum(u.resident for u in handle.units),
                 "units": len(handle.units)}
    return {"tokens_per_s": NEW_TOKENS / min(times), "weights_bytes": weights,
            "peak_resident_bytes": peak, "tokens": out[0, PROMPT:].tolist(), **extra}


def run_train(variant):
    import torch
    if variant == "torch_uvm_offload":
        import torch_uvm
        torch_uvm.set_enabled_uvm(True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(TRAIN_WIDTH, TRAIN_WIDTH, bias=False)
                                  for _ in range(TRAIN_LAYERS)])
    x = torch.randn(TRAIN_BATCH, TRAIN_WIDTH, generator=torch.Generator().manual_seed(1)).cuda()
    if variant == "resident":
        model.cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        handle = torch_uvm.offload(model, budget=TRAIN_BUDGET, device="cuda")
        optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    losses, times = [], []
    for _ in range(TRAIN_STEPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    extra = {}
    if variant == "torch_uvm_offload":
        s = torch_uvm.residency_stats()
        extra = {"peak_resident_bytes": s["resident_bytes.peak"],
                 "evictions": {k: v for k, v in s.items() if k.startswith("evict")}}
    steady = sorted(times[1:])
    return {"s_per_step": steady[len(steady) // 2], "first_step_s": times[0], "losses": losses,
            **extra}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant")
    ap.add_argument("--scenario")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="generate,train")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    if args.variant:
        fn = run_generate if args.scenario == "generate" else run_train
        print("RESULT " + json.dumps(fn(args.variant)), flush=True)
        return
    scenarios = [s for s in args.only.split(",") if s in PLAN]
    runs = method.scenario_runs(os.path.abspath(__file__), PLAN, scenarios, args.rounds,
                                timeout=400)

    def metric(s, v, key):
        return [r[key] if r else None for r in runs[s][v]]
    compared, tables = {}, {}
    if "generate" in runs:
        ref = next((r["tokens"] for r in runs["generate"]["resident"] if r), None)
        print(f"\n(b) GPT-2-style, n_embd 2048, 30 layers (~3 GiB fp16), {NEW_TOKENS} tokens from "
              f"a {PROMPT}-token prompt, budget {GEN_BUDGET / GiB:.1f} GiB")
        print("| variant | tokens/s (median, min-max) | peak resident | tokens = all resident |")
        print("|---|---|---|---|")
        for v, rs in runs["generate"].items():
            ok = [r for r in rs if r]
            if not ok:
                print(f"| {v} | failed | | |")
                continue
            t = method.summarize([r["tokens_per_s"] for r in ok])
            same = all(r["tokens"] == ref for r in ok) if ref else None
            tables[f"generate/{v}"] = {**{k: ok[-1][k] for k in ok[-1] if k != "tokens"},
                                       "tokens_per_s": t, "same_tokens": same}
            print(f"| {v} | {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | "
                  f"{ok[-1]['peak_resident_bytes'] / MiB:.0f} MiB | {same} |")
        compared["(b) torch_uvm.offload / accelerate dispatch_model, tokens/s"] = method.ratio(
            metric("generate", "torch_uvm_offload", "tokens_per_s"),
            metric("generate", "accelerate_dispatch", "tokens_per_s"), lower_is_better=False)
    if "train" in runs:
        ref = next((r["losses"] for r in runs["train"]["resident"] if r), None)
        print(f"\n(c) {TRAIN_LAYERS} x fp32 Linear({TRAIN_WIDTH}, {TRAIN_WIDTH}) (2 GiB), AdamW, "
              f"batch {TRAIN_BATCH}, budget {TRAIN_BUDGET / GiB:.0f} GiB")
        print("| variant | s / step (median of steps 2-4; rounds min-max) | peak resident | "
              "losses = all resident |")
        print("|---|---|---|---|")
        for v, rs in runs["train"].items():
            ok = [r for r in rs if r]
            if not ok:
                print(f"| {v} | failed | | |")
                continue
            t = method.summarize([r["s_per_step"] for r in ok])
            same = all(r["losses"] == ref for r in ok) if ref else None
            peak = ok[-1].get("peak_resident_bytes")
            tables[f"train/{v}"] = {**ok[-1], "s_per_step": t, "same_losses": same}
            print(f"| {v} | {t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f}) | "
                  f"{'all (8 GiB with grads and moments)' if peak is None else f'{peak / MiB:.0f} MiB'} "
                  f"| {same} |")
        compared["(c) torch_uvm.offload / all resident, s per step"] = method.ratio(
            metric("train", "torch_uvm_offload", "s_per_step"), metric("train", "resident", "s_per_step"))
    print("\n| ratio (each round's runs paired) | median (min–max) | target | |")
    print("|---|---|---|---|")
    for name, summary in compared.items():
        print(method.describe(name, summary))
    os.makedirs(args.out, exist_ok=True)
    method.write(os.path.join(args.out, "offload_generate_train.json"), compared, runs=runs,
                 tables=tables)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, prefix, key, label in [(axes[0], "generate/", "tokens_per_s", "tokens/s"),
                                       (axes[1], "train/", "s_per_step", "s / step (log)")]:
            rows = {k[len(prefix):]: v[key] for k, v in tables.items() if k.startswith(prefix)}
            ax.bar(list(rows), [r["median"] for r in rows.values()],
                   yerr=[[r["median"] - r["min"] for r in rows.values()],
                         [r["max"] - r["median"] for r in rows.values()]], capsize=4)
            ax.set_ylabel(label)
            if key == "s_per_step":
                ax.set_yscale("log")
        axes[0].set_title("(b) generate, 3 GiB model, 1.5 GiB budget")
        axes[1].set_title("(c) train, 2 GiB MLP + AdamW, 1 GiB budget")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "offload_generate_train.png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no plot")


if __name__ == "__main__":
    main()
