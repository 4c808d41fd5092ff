"""torch_uvm.estimate against what the committed runs measured: the process's
GPU memory (mem_get_info, apart from the books), the host's peak, and the
time a step or a token took, for every workload the benchmarks ran under a
budget: from a transformer config, or, for a module that has none (the
MLP), from one forward on the meta device (estimate's inputs=).

    python benchmarks/estimate_check.py [--out DIR]

The estimate's target (issue 55): GPU and host memory within 10% of the
measured, and its time never above the measured (it is a floor). Each
measured figure is read from its JSON here, at the path and key named;
each estimate uses the link rate that JSON's run measured. Prints a table
and writes estimate_check.json to --out. tests/python/test_estimate.py
asserts the same targets."""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from torch_uvm.estimate import estimate  # noqa: E402

GiB = 1 << 30
RESULTS = os.path.join(HERE, "results")
LLAMA_7B = dict(model_type="llama", num_hidden_layers=32, hidden_size=4096,
                intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                vocab_size=32000, tie_word_embeddings=False)        # offload_llama.SHAPES
LLAMA_3B = dict(model_type="llama", num_hidden_layers=28, hidden_size=3072,
                intermediate_size=8192, num_attention_heads=24, num_key_value_heads=8,
                vocab_size=32000, tie_word_embeddings=False)
GPT2_TRAIN = dict(model_type="gpt2", n_embd=2048, n_layer=24, n_head=16, n_positions=512,
                  vocab_size=50257, attn_pdrop=0.0, resid_pdrop=0.0,
                  embd_pdrop=0.0)                                    # offload_train's gpt2
GPT2_GEN = dict(model_type="gpt2", n_embd=2048, n_layer=30, n_head=16, n_positions=1024,
                vocab_size=50257)                                    # offload_generate's



def mlp():
    """offload_train's MLP (MLP_LAYERS x Linear(MLP_WIDTH, MLP_WIDTH), no
    bias, fp32), on the meta device."""
    import torch
    from offload_train import MLP_LAYERS, MLP_WIDTH
    with torch.device("meta"):
        return torch.nn.Sequential(*[torch.nn.Linear(MLP_WIDTH, MLP_WIDTH, bias=False)
                                     for _ in range(MLP_LAYERS)])


def linears():
    """larger_than_gpu's model (LAYERS x fp16 Linear(WIDTH, WIDTH), no bias),
    on the meta device."""
    import torch
    from larger_than_gpu import LAYERS, WIDTH
    with torch.device("meta"):
        return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False)
                                     for _ in range(LAYERS)]).half().eval()


def linears_inputs():
    import torch
    from larger_than_gpu import BATCH, WIDTH
    return torch.empty(BATCH, WIDTH, dtype=torch.float16, device="meta")


def mlp_inputs():
    import torch
    from offload_train import MLP_BATCH, MLP_WIDTH
    return torch.empty(MLP_BATCH, MLP_WIDTH, device="meta")


# The rows whose estimate misses its target: the row's name, what misses
# ("gpu", "host" or "gpu and host"), and why. The test asserts that each still misses (fixed,
# it must leave this list) and that every other row meets the target.
RUNTIME = ("the process beside its homes took 2.0 GiB, against the 1.5 GiB the estimate "
           "gives every process (HOST_RUNTIME_BYTES): the all-resident run of the same "
           "benchmark took 0.93 GiB beside its 3 GiB of weights, torch_uvm's 1.08 GiB more. "
           "The 7B's runs took 1.57 GiB beside their homes, the MLP's 0.98: what a process "
           "imports and caches varies by 1 GiB, which the estimate does not read")
APART = ("over, on the safe side: the run allocated at most 2.65 GiB beside its slots "
         "(max_memory_allocated less the slots) and cached 0.73 GiB more; the estimate "
         "adds the checkpoints and a layer's work (1.53 GiB) to the logits and their "
         "fp32 gradients (1.22 GiB), whose peaks do not coincide, and a cache of 1.38 GiB. "
         "The same sum is 1.044-1.083 of the 3B's measure (fp32 weights under autocast); under "
         "24 GiB, every weight resident, this run's is 1.046")
MISSES: dict = {
    "7B full fine-tune in bf16, gpu_memory 8 GiB (budget chosen 2.01 GiB), step in backward, "
    "host step, H200": ("gpu", APART),
    "3 GiB fp16 generation, 1.5 GiB, batch 1, H200": ("host", RUNTIME),
    "3 GiB fp16 generation, gpu_memory 2 GiB (budget chosen 1.00 GiB), batch 1, H200":
        ("gpu and host", RUNTIME + ". Its GPU estimate is over, on the safe side: 1.20 GiB "
         "against 1.08; beside the slots the run took 0.08 GiB, the estimate 0.20 (a "
         "forward's runtime, FORWARD_RUNTIME_BYTES, 192 MiB, alone)"),
}

# name, config, estimate's arguments, (JSON, run path), where the GPU peak,
# the host peak and the seconds a step/token are in that run (None: not recorded)
CASES = [
    ("3B full fine-tune, 8 GiB, step in backward", LLAMA_3B,
     dict(task="full", budget="8GiB", batch=4, seq=1024),
     ("2026-11-27-h100/offload_train-llama.json", ["runs", "llama", "torch_uvm_in_backward"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("3B full fine-tune, 4 GiB, step in backward", LLAMA_3B,
     dict(task="full", budget="4GiB", batch=4, seq=1024),
     ("2026-11-27-h100/offload_train-llama-host.json",
      ["runs", "llama", "torch_uvm_in_backward_4GiB"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("GPT-2 1.2B, 4 GiB, fp32, no checkpointing", GPT2_TRAIN,
     dict(task="full", budget="4GiB", batch=4, seq=512, checkpointing=False, autocast=False),
     ("2026-11-26-h100/offload_train-gpt2.json", ["runs", "gpt2", "torch_uvm_in_backward"]),
     "process_gpu_memory.peak_bytes", None, "s_per_step"),
    ("7B LoRA, 0.5 GiB, batch 4", LLAMA_7B,
     dict(task="lora", budget="0.5GiB", batch=4, seq=1024, dtype="bfloat16"),
     ("2026-11-27-h100/offload_lora.json", ["runs", "torch_uvm_0.5GiB_lora"]),
     "batches.4.gpu_peak_timed_bytes", "host_peak_bytes", "batches.4.s_per_step"),
    ("7B generation, 4 GiB, batch 1", LLAMA_7B,
     dict(task="generate", budget="4GiB", batch=1, seq=32, new_tokens=16, dtype="bfloat16"),
     ("2026-11-26-h100/offload_llama.json", ["runs", "torch_uvm_4GiB_b1"]),
     "batches.1.gpu_peak_timed_bytes", "host_peak_bytes", "batches.1.tokens_per_s"),
    ("7B generation, 4 GiB, batch 8", LLAMA_7B,
     dict(task="generate", budget="4GiB", batch=8, seq=32, new_tokens=16, dtype="bfloat16"),
     ("2026-11-26-h100/offload_llama.json", ["runs", "torch_uvm_4GiB_b8"]),
     "batches.8.gpu_peak_timed_bytes", "host_peak_bytes", "batches.8.tokens_per_s"),
    ("7B generation, 8 GiB, batch 1", LLAMA_7B,
     dict(task="generate", budget="8GiB", batch=1, seq=32, new_tokens=16, dtype="bfloat16"),
     ("2026-11-26-h100/offload_llama.json", ["runs", "torch_uvm_8GiB_b1"]),
     "batches.1.gpu_peak_timed_bytes", "host_peak_bytes", "batches.1.tokens_per_s"),
    ("3B full fine-tune, 8 GiB, step in backward, host step, H200", LLAMA_3B,
     dict(task="full", budget="8GiB", batch=4, seq=1024, host_step=1.0),
     ("2026-11-29-h200/trees-17a9b08-3B.json",
      ["runs", "offload_train:llama/torch_uvm_in_backward_host1_nonblocking", "new"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("7B LoRA, 1 GiB, batch 4, H200", LLAMA_7B,
     dict(task="lora", budget="1GiB", batch=4, seq=1024, dtype="bfloat16"),
     ("2026-11-28-h200/trees-17a9b08-59b15da.json",
      ["runs", "offload_lora:lora/torch_uvm_1GiB", "new"]),
     "batches.4.gpu_peak_timed_bytes", "host_peak_bytes", "batches.4.s_per_step"),
    ("7B generation, 4 GiB, batch 1, H200", LLAMA_7B,
     dict(task="generate", budget="4GiB", batch=1, seq=32, new_tokens=16, dtype="bfloat16"),
     ("2026-11-29-h200/trees-17a9b08-7B-generation.json",
      ["runs", "offload_llama:generate/torch_uvm_4GiB_b1", "new"]),
     "batches.1.gpu_peak_timed_bytes", "host_peak_bytes", "batches.1.tokens_per_s"),
    ("7B generation, 4 GiB, batch 8, H200", LLAMA_7B,
     dict(task="generate", budget="4GiB", batch=8, seq=32, new_tokens=16, dtype="bfloat16"),
     ("2026-11-29-h200/trees-17a9b08-7B-generation.json",
      ["runs", "offload_llama:generate/torch_uvm_4GiB_b8", "new"]),
     "batches.8.gpu_peak_timed_bytes", "host_peak_bytes", "batches.8.tokens_per_s"),
    ("3 GiB fp16 generation, 1.5 GiB, batch 1", GPT2_GEN,
     dict(task="generate", budget=3 * GiB // 2, batch=1, seq=32, new_tokens=32, dtype="float16"),
     ("2026-11-26-h100/offload_generate.json", ["runs", "torch_uvm_offload"]),
     "process_gpu_memory.peak_bytes", None, "tokens_per_s"),
    ("GPT-2 1.2B, gpu_memory 19 GiB (budget chosen 3.43 GiB), host step, fp32, H200", GPT2_TRAIN,
     dict(task="full", budget=3678601216, batch=4, seq=512, checkpointing=False, autocast=False,
          host_step=1.0),
     ("2026-11-29-h200-x2/offload_train-gpt2-bound-planned.json",
      ["runs", "gpt2", "torch_uvm_bound_19GiB_in_backward_host1_nonblocking"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("the MLP, 1 GiB, step in backward, H200", mlp,
     dict(task="full", budget="1GiB", autocast=False, inputs=mlp_inputs),
     ("2026-11-29-h200-x2/trees-9be3704-steps-behind.json",
      ["runs", "offload_train:mlp/torch_uvm_in_backward", "new"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("the MLP, gpu_memory 3 GiB (budget chosen 1.09 GiB), step in backward, H200", mlp,
     dict(task="full", budget=1174011904, autocast=False, inputs=mlp_inputs),
     ("2026-11-29-h200-x2/trees-9be3704-steps-behind.json",
      ["runs", "offload_train:mlp/torch_uvm_bound_3GiB_in_backward", "new"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("2 GiB of fp16 Linears, 1 GiB, batch 16, H200", linears,
     dict(task="generate", budget="1GiB", inputs=linears_inputs),
     ("2026-11-30-h200-x2/larger_than_gpu-bound.json", ["runs", "model", "torch_uvm_offload"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "ms"),
    ("2 GiB of fp16 Linears, gpu_memory 2 GiB (budget chosen 0.96 GiB), batch 16, H200", linears,
     dict(task="generate", budget=1025966080, inputs=linears_inputs),
     ("2026-11-30-h200-x2/larger_than_gpu-bound.json", ["runs", "model", "torch_uvm_bound_2GiB"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "ms"),
    ("3 GiB fp16 generation, 1.5 GiB, batch 1, H200", GPT2_GEN,
     dict(task="generate", budget=3 * GiB // 2, batch=1, seq=32, new_tokens=32, dtype="float16"),
     ("2026-11-30-h200-x2/offload_generate-meta.json", ["runs", "torch_uvm_offload"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "tokens_per_s"),
    ("3 GiB fp16 generation, gpu_memory 2 GiB (budget chosen 1.00 GiB), batch 1, H200", GPT2_GEN,
     dict(task="generate", budget=1068898599, batch=1, seq=32, new_tokens=32, dtype="float16"),
     ("2026-11-30-h200-x2/offload_generate-meta.json", ["runs", "torch_uvm_bound_2GiB"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "tokens_per_s"),
    ("7B generation, gpu_memory 5 GiB (budget chosen 3.80 GiB), batch 1, H200", LLAMA_7B,
     dict(task="generate", budget=4080376576, batch=1, seq=32, new_tokens=16, dtype="bfloat16"),
     ("2026-11-29-h200/offload_llama-bound.json", ["runs", "torch_uvm_bound_5GiB_b1"]),
     "batches.1.gpu_peak_timed_bytes", "host_peak_bytes", "batches.1.tokens_per_s"),
    ("7B generation, gpu_memory 5 GiB (budget chosen 3.57 GiB), batch 8, H200", LLAMA_7B,
     dict(task="generate", budget=3832010752, batch=8, seq=32, new_tokens=16, dtype="bfloat16"),
     ("2026-11-29-h200/offload_llama-bound.json", ["runs", "torch_uvm_bound_5GiB_b8"]),
     "batches.8.gpu_peak_timed_bytes", "host_peak_bytes", "batches.8.tokens_per_s"),
    ("3B full fine-tune, gpu_memory 14 GiB (budget chosen 6.16 GiB), step in backward, host step, "
     "H200", LLAMA_3B,
     dict(task="full", budget=6613565440, batch=4, seq=1024, host_step=1.0),
     ("2026-11-29-h200/offload_train-llama-bound.json",
      ["runs", "llama", "torch_uvm_bound_14GiB_in_backward_host1_nonblocking"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("7B LoRA, gpu_memory 6 GiB (budget chosen 0.64 GiB), batch 4, H200", LLAMA_7B,
     dict(task="lora", budget=688750592, batch=4, seq=1024, dtype="bfloat16"),
     ("2026-11-29-h200-x2/offload_lora-bound.json", ["runs", "torch_uvm_bound_6GiB"]),
     "batches.4.gpu_peak_timed_bytes", "host_peak_bytes", "batches.4.s_per_step"),
    ("7B LoRA, gpu_memory 24 GiB (budget chosen 12.70 GiB: every weight resident), batch 4, H200",
     LLAMA_7B, dict(task="lora", budget=13640966656, batch=4, seq=1024, dtype="bfloat16"),
     ("2026-11-30-h200-x2/offload_lora-24GiB-whole.json", ["runs", "torch_uvm_bound_24GiB"]),
     "batches.4.gpu_peak_timed_bytes", "host_peak_bytes", "batches.4.s_per_step"),
    # load_llama counts the host from its start (host_base): the whole process is both
    ("7B generation from safetensors, gpu_memory 5 GiB (budget chosen 3.06 GiB), batch 1, H200",
     LLAMA_7B, dict(task="generate", budget=3281087936, batch=1, seq=32, new_tokens=16,
                    dtype="bfloat16"),
     ("2026-11-30-h200-x2/load_llama-bound.json", ["runs", "torch_uvm_checkpoint_bound"]),
     "gpu_peak_bytes", "host_peak_bytes+host_base_bytes", "tokens_per_s"),
    # (host_step=1 asked; every unit stayed resident, so none stepped on the host)
    ("7B full fine-tune in bf16, gpu_memory 24 GiB (budget chosen 14.02 GiB: every weight "
     "resident), step in backward, H200", LLAMA_7B,
     dict(task="full", budget=15049695744, batch=4, seq=1024, autocast=False, dtype="bfloat16",
          host_step=1.0),
     ("2026-11-30-h200-x2/offload_train-7b-full-rounds.json",
      ["runs", "llama7b", "torch_uvm_bound_24GiB_in_backward_host1_nonblocking"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
    ("7B full fine-tune in bf16, gpu_memory 8 GiB (budget chosen 2.01 GiB), step in backward, "
     "host step, H200", LLAMA_7B,
     dict(task="full", budget=2162360320, batch=4, seq=1024, autocast=False, dtype="bfloat16",
          host_step=1.0),
     ("2026-11-30-h200-x2/offload_train-7b-full-8GiB.json",
      ["runs", "llama7b", "torch_uvm_bound_8GiB_in_backward_host1_nonblocking"]),
     "process_gpu_memory.peak_bytes", "host_peak_bytes", "s_per_step"),
]


def dig(d, dotted):
    """`d`'s value at the dotted key; keys joined by + are summed."""
    if "+" in dotted:
        parts = [dig(d, k) for k in dotted.split("+")]
        return None if None in parts else sum(parts)
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def measured(source, gpu_key, host_key, time_key, batch):
    """(GPU peak, host peak, seconds a step or a token, the pinned rate) of
    the run's last round that recorded them (a token: every sequence of the
    batch one token further, from tokens/s over the batch). A trees.py run
    names its tree last ("new": this project's tree then)."""
    path, keys = source
    with open(os.path.join(RESULTS, path)) as f:
        runs = top = json.load(f)
    for k in keys[:-1]:
        runs = runs[k]
    run = [r for r in runs[keys[-1]] if r][-1]
    # (a benchmark's own rounds, or trees.py's, which keeps its rates at the top)
    rates = [r for r in runs.get("pinned_rate", top.get("pinned_rates", [])) if r]
    seconds = dig(run, time_key)
    if seconds is not None and time_key.endswith("tokens_per_s"):
        seconds = batch / seconds
    if seconds is not None and time_key == "ms":    # (a forward's milliseconds)
        seconds = seconds / 1000
    return (dig(run, gpu_key), dig(run, host_key) if host_key else None, seconds,
            rates[-1]["h2d_gbps"] if rates else None)


def check():
    rows = []
    for name, config, kwargs, source, gpu_key, host_key, time_key in CASES:
        gpu, host, seconds, rate = measured(source, gpu_key, host_key, time_key,
                                            kwargs.get("batch", 1))
        if callable(config):     # a module built on the meta device, with its inputs
            config, kwargs = config(), {**kwargs, "inputs": kwargs["inputs"]()}
        est = estimate(config, link_gbps=rate or 55.0, **kwargs)
        rows.append({"case": name, "source": source[0],
                     "gpu_estimate": est.gpu_total, "gpu_measured": gpu,
                     "host_estimate": est.host, "host_measured": host,
                     "floor_s": est.floor_s, "measured_s": seconds, "rate_gbps": rate,
                     "parts": est.gpu, "miss": MISSES.get(name)})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = check()
    g = lambda b: "—" if b is None else f"{b / GiB:.2f}"  # noqa: E731
    r = lambda a, b: "—" if not (a and b) else f"{a / b:.3f}"  # noqa: E731
    print("| case | GPU estimate / measured (GiB) | ratio | host estimate / measured (GiB) | "
          "ratio | time floor / measured (s) | the run |")
    print("|---|---|---|---|---|---|---|")
    for x in rows:
        t = "—" if x["measured_s"] is None else f"{x['floor_s']:.3f} / {x['measured_s']:.3f}"
        print(f"| {x['case']} | {g(x['gpu_estimate'])} / {g(x['gpu_measured'])} | "
              f"{r(x['gpu_estimate'], x['gpu_measured'])} | {g(x['host_estimate'])} / "
              f"{g(x['host_measured'])} | {r(x['host_estimate'], x['host_measured'])} | {t} | "
              f"{x['source']} |")
    for x in rows:
        if x["miss"]:
            what = x["miss"][0].replace("gpu", "GPU")
            print(f"  {x['case']}: the {what} estimate{'s are' if ' and ' in what else ' is'} "
                  f"outside the target. {x['miss'][1]}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        import platform
        from method import machine
        where = machine() | {"cpu": platform.processor() or platform.machine()}
        for key in ("gpu", "driver"):    # (computed without one, from the runs' files: said so)
            where[key] = where[key] or "none: computed on the CPU from the runs' JSONs"
        with open(os.path.join(args.out, "estimate_check.json"), "w") as f:
            json.dump({"machine": where, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
