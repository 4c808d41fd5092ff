"""Larger than the GPU, LoRA fine-tuning of a Llama-architecture 7B model
(issue 35, point 1, second bullet) under budgets of 4 and 8 GiB, beside
all-resident, PyTorch's FSDP2 CPUOffloadPolicy and DeepSpeed ZeRO-3 with its
parameters offloaded, against the link's limit measured in the same round.

    python benchmarks/offload_lora.py [--rounds 1] [--variants a,b] [--tiny] [--out DIR]

The model: offload_llama's 7B (32 layers, hidden 4096, random bf16 weights,
13.48 GB, built on the CPU without a second host copy). PEFT LoRA rank 16
(alpha 32, no dropout) on q, k, v, o, gate, up and down: 40 M trainable
parameters, fp32 as PEFT makes them beside a bf16 base. Activation
checkpointing (HF's, non-reentrant), as PEFT's and torchtune's LoRA recipes
use it. AdamW (lr 1e-4, fused) over the trainable parameters. Sequence 1024,
batch 1 then batch 4 in one process: a first step right after the placement
(what a user waits for, with the placement's own time), then at each batch
one warm-up step and three timed steps, the median counting. Losses are the
loss of every step, compared with all-resident's.

Variants, each in a fresh process, interleaved round by round:
- pinned_rate: 1 GiB pinned copies, the link's rate for this round.
- resident: the whole model on the GPU (the compute limit).
- torch_uvm_<B>GiB: torch_uvm.offload(model, budget=B), stream_optimizer.
- torch_uvm_bound_<G>GiB: torch_uvm.offload(model, gpu_memory=G, batch=4,
  seq=1024): the whole process held to G GiB, the budget chosen within it;
  its report sets the process's whole peak (CUDA's start and the run's
  peak) beside G and the budget chosen.
- fsdp2_cpu_offload: fully_shard on every decoder layer and the root, with
  CPUOffloadPolicy (weights, gradients and states in pinned host memory; the
  step on the CPU with fused AdamW, PyTorch's fastest CPU step). Where
  FSDP2 wants one dtype per group of parameters (older PyTorch), each LoRA
  Linear is its own group.
- deepspeed_zero3_offload: ZeRO-3 with parameters and optimizer offloaded,
  bf16 (its documented mixed precision: fp32 master copies of the adapters in
  the optimizer), tuned as offload_train tunes it, its live parameters
  capped at 8 GiB of bf16 elements. Carried as wheels (DS_BUILD_OPS=0).
- qlora_nf4: the all-resident memory saver users pick instead (QLoRA, as
  torchtune's and PEFT's recipes build it): the decoder layers' Linears
  in 4-bit NF4 with double quantization (bitsandbytes' Linear4bit, bf16
  compute, quantized on the GPU as the model moves there: build_s holds
  it), the same adapters, checkpointing and AdamW, all on the GPU. Other
  arithmetic: its losses are not compared. torchtune quantizes with
  torchao's NF4; its published QLoRA of Llama-3.1-8B: 7.4 GiB at 2413
  tokens/s on an RTX 4090.

The link limit: a budget of B bytes holds at most B of the W bytes of
parameters, so at least W - B cross to the GPU in each pass, forward and
backward (a recomputation runs beside its backward): tokens/s <= tokens per
step x h2d / (2 (W - B)). The frozen base sends nothing home; the adapters'
updates are small enough to stay in any budget. The compute limit is
all-resident's step. Target: torch_uvm within 1.3x of the larger of the two.

Beside every figure: the process's GPU memory (the driver's free memory,
sampled; offload_llama.GpuMemory) over the timed steps and over the run,
PyTorch's allocator's peaks (what its tensors took, and what it reserved),
and the peak host memory (ru_maxrss).

Duration on an H100: 326 s a round (each process builds the model in ~21 s;
DeepSpeed's placement takes ~54 s). --tiny runs the whole script on a
2-layer Llama in ~150 s, most of it the processes' start (results to
offload_lora_tiny.*).

Losses: torch_uvm runs all-resident's arithmetic. PyTorch's default
kernels need not be deterministic (SDPA's backward, cuBLAS's split
reductions), so OFFLOAD_DETERMINISTIC=1 runs every variant with
deterministic kernels and eager attention: there torch_uvm's losses can
equal all resident's bit for bit, and the table says whether they do.

OFFLOAD_PROFILE=DIR profiles one more batch-1 step of all resident and of
each torch_uvm variant (traces to DIR) and prints where the GPU's time
went: each stream's kernels and copies, and the span.

Opt-in variants torch_uvm_0.5GiB, _1GiB, _2GiB, _3GiB, _6GiB and _10GiB
draw torch_uvm's speed-for-memory curve beside the anchors' points (the
plot joins torch_uvm's budgets); the smallest reach FSDP2's memory. A
torch_uvm variant ending in _lora streams each PEFT LoRA layer (base weight
and adapters) as one unit, _layers each decoder layer (offload's units=):
by default each Linear is a unit, and two of every three are an adapter's
few hundred KiB, each brought and stepped on its own. Each torch_uvm row records the bytes it brought to the
GPU a step (its books) beside the least any placement brings.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torch_uvm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # method
import method  # noqa: E402
from method import gib_cell, median_cell  # noqa: E402
import offload_llama  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
BATCHES, SEQ, TIMED, LR = (1, 4), 1024, 3, 1e-4
BUDGETS_GIB = (4, 8)
DS_LIVE_GIB = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Under gpu_memory (issue 55): the whole process held to about what the
# 1 GiB budget's run took (5.27 GiB beside CUDA's start), the budget chosen
# within it for the largest batch.
BOUND_GIB = 6
VARIANTS = (["pinned_rate", "resident"] + [f"torch_uvm_{g}GiB" for g in BUDGETS_GIB]
            + [f"torch_uvm_bound_{BOUND_GIB}GiB"]
            + ["fsdp2_cpu_offload", "deepspeed_zero3_offload", "qlora_nf4"])
# Opt-in: more budgets, for torch_uvm's speed-for-memory curve (issue 35, point 3)
CURVE = [f"torch_uvm_{g}GiB" for g in (0.5, 1, 2, 3, 6, 10)]
# A torch_uvm variant ending in one of these streams such units (offload's units=)
UNITS = {"lora": "each PEFT LoRA layer (its base weight and adapters) as one unit",
         "layers": "each decoder layer as one unit"}
CURVE += [f"torch_uvm_{g}GiB_{u}" for g in (0.5, 1, 4) for u in UNITS]
# A 24 GB card (issue 56's recipes, examples/recipes/lora_7b.py): the whole process within it
CURVE.append(f"torch_uvm_bound_{offload_llama.CARD_GIB}GiB")
EXACT = ("resident", "torch_uvm")   # the same arithmetic: losses can equal all-resident's


def nf4_base(model) -> None:
    """QLoRA's base as users make it, on the GPU: each Linear of the decoder
    layers a bitsandbytes Linear4bit (NF4, double quantization, bf16
    compute; what transformers' BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True) loads),
    quantized as it moves to the GPU; embeddings, norms and head stay bf16."""
    import bitsandbytes as bnb
    import torch
    for layer in model.model.layers:
        for name, m in list(layer.named_modules()):
            if type(m) is not torch.nn.Linear:
                continue
            q = bnb.nn.Linear4bit(m.in_features, m.out_features, bias=m.bias is not None,
                                  compute_dtype=torch.bfloat16, compress_statistics=True,
                                  quant_type="nf4", device="meta")
            q.weight = bnb.nn.Params4bit(m.weight.data, requires_grad=False,
                                         compress_statistics=True, quant_type="nf4", module=q)
            if m.bias is not None:
                q.bias = m.bias
            parent, _, leaf = name.rpartition(".")
            setattr(layer.get_submodule(parent) if parent else layer, leaf, q)
    model.cuda()                                  # quantizes each Params4bit as it moves
    try:                                          # PEFT's cue for its Linear4bit adapters
        model.is_loaded_in_4bit = True
    except AttributeError:
        pass


def peft_model(tiny: bool, nf4: bool = False):
    import torch
    from peft import LoraConfig, get_peft_model
    model = offload_llama.build(tiny, **({"attn_implementation": "eager"}
                                          if method.DETERMINISTIC else {}))
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if nf4:
        nf4_base(model)
    torch.manual_seed(0)                  # the adapters' initial values
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    return model


def units_option(variant: str) -> str:
    """A torch_uvm variant's UNITS key (its suffix), or "" for the default."""
    suffix = variant.rsplit("_", 1)[-1]
    return suffix if suffix in UNITS else ""


def unit_classes(option: str):
    """offload's units= for a variant's UNITS suffix (None: each submodule)."""
    if option == "lora":
        from peft.tuners.lora import LoraLayer
        return (LoraLayer,)
    if option == "layers":
        return ("LlamaDecoderLayer",)
    return None


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def fsdp2(model):
    import inspect
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29535")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    policy = CPUOffloadPolicy()
    # PyTorch before 2.12 or so wants one dtype in a group even for frozen
    # parameters: there each LoRA Linear (fp32) is a group of its own
    mixed_ok = "trainable_params" in inspect.getsource(FSDPParamGroup._init_mp_dtypes)
    for layer in model.base_model.model.model.layers:
        if not mixed_ok:
            for name, m in layer.named_modules():
                if name.rsplit(".", 2)[-2:-1] in (["lora_A"], ["lora_B"]):
                    fully_shard(m, offload_policy=policy)
        fully_shard(layer, offload_policy=policy)
    fully_shard(model, offload_policy=policy)
    return model, {"lora_linears_sharded_apart": not mixed_ok}


def deepspeed(model, budget_hidden: int):
    import deepspeed as ds
    import offload_train
    config = offload_train.deepspeed_config(3, DS_LIVE_GIB * GiB, budget_hidden, LR)
    config["zero_optimization"]["stage3_max_live_parameters"] = DS_LIVE_GIB * GiB // 2   # bf16
    config["bf16"] = {"enabled": True}
    config["train_micro_batch_size_per_gpu"] = BATCHES[0]
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29536"), ("RANK", "0"),
                       ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    engine, _, _, _ = ds.initialize(model=model, model_parameters=trainable(model), config=config)
    return engine, {"zero_optimization": config["zero_optimization"]}


def run_variant(variant: str, tiny: bool) -> dict:
    if variant == "pinned_rate":
        return method.pinned_rate()
    import torch
    method.deterministic_kernels()
    kind = "torch_uvm" if variant.startswith("torch_uvm") else variant
    gpu = offload_llama.GpuMemory()
    gpu.start("run")            # QLoRA's base is quantized on the GPU as it is built
    t0 = time.perf_counter()
    model = peft_model(tiny, nf4=kind == "qlora_nf4")
    out = {"build_s": time.perf_counter() - t0,
           "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "trainable_bytes": sum(p.numel() * p.element_size() for p in trainable(model)),
           "tokens_per_step": {}, "batches": {}}
    bound = variant.startswith("torch_uvm_bound_")
    if bound:             # (the bound counts the whole process: not scaled for --tiny)
        out["bound_bytes"] = int(method.variant_gib(variant) * GiB)
        out["process_gpu_at_start_bytes"] = torch.cuda.mem_get_info()[1] - gpu.base
    elif kind == "torch_uvm":
        out["budget_bytes"] = offload_llama.budget_bytes(method.variant_gib(variant), tiny)
    vocab, seq = model.config.vocab_size, 128 if tiny else SEQ
    if kind != "qlora_nf4":
        gpu.start("run")
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    engine = None
    if kind in ("resident", "qlora_nf4"):
        model.cuda()
    elif kind == "torch_uvm":
        import torch_uvm
        out["units_option"] = units_option(variant)
        if bound:         # what building the model left cached is not the process's
            torch.cuda.empty_cache()
            handle = torch_uvm.offload(model, gpu_memory=out["bound_bytes"], device="cuda",
                                       units=unit_classes(out["units_option"]),
                                       batch=max(BATCHES), seq=seq)
            out["budget_bytes"] = handle.state.bound.budget
        else:
            handle = torch_uvm.offload(model, budget=out["budget_bytes"], device="cuda",
                                       units=unit_classes(out["units_option"]))
    elif kind == "fsdp2_cpu_offload":
        model, out["fsdp2"] = fsdp2(model)
    else:
        engine, out["deepspeed"] = deepspeed(model, model.config.hidden_size)
    if engine is None:
        optimizer = torch.optim.AdamW(trainable(model), lr=LR, fused=True)
        if kind == "torch_uvm":
            optimizer = handle.stream_optimizer(optimizer)
    torch.cuda.synchronize()
    out["place_s"] = time.perf_counter() - t0

    def step(ids) -> float:
        loss = (engine or model)(input_ids=ids, labels=ids).loss
        if engine is not None:     # the engine's own (it zeroes the gradients)
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return loss.item()

    def batch(b):
        return torch.randint(0, vocab, (b, seq), generator=torch.Generator().manual_seed(b)).cuda()
    t0 = time.perf_counter()
    first = step(batch(BATCHES[0]))
    out["first_step_s"] = time.perf_counter() - t0
    for b in BATCHES:
        ids = batch(b)
        losses = [first] if b == BATCHES[0] else []
        losses.append(step(ids))                                  # warm-up
        gpu.start("timed")
        moved = handle.residency_stats()["prefetched_bytes"] if kind == "torch_uvm" else None
        times = []
        for _ in range(TIMED):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            losses.append(step(ids))
            times.append(time.perf_counter() - t0)
        s = sorted(times)[len(times) // 2]
        out["tokens_per_step"][str(b)] = b * seq
        out["batches"][str(b)] = {"s_per_step": s, "times_s": times, "tokens_per_s": b * seq / s,
                                  "losses": losses, "gpu_peak_timed_bytes": gpu.peak("timed")}
        if moved is not None:     # what torch_uvm brought to the GPU a step (its books)
            out["batches"][str(b)]["to_gpu_bytes_per_step"] = (
                handle.residency_stats()["prefetched_bytes"] - moved) / TIMED
    where = os.environ.get("OFFLOAD_PROFILE")   # a folder: one more batch-1 step, profiled
    if where and kind in ("resident", "torch_uvm"):
        os.makedirs(where, exist_ok=True)
        ids = batch(BATCHES[0])
        t0 = time.perf_counter()
        out["profile"] = method.profiled(lambda: step(ids),
                                         os.path.join(where, f"offload_lora_{variant}.json"))
        out["profile"]["wall_s"] = time.perf_counter() - t0
    out.update(gpu_peak_run_bytes=gpu.peak("run"),
               torch_reserved_peak_bytes=torch.cuda.max_memory_reserved(),
               torch_allocated_peak_bytes=torch.cuda.max_memory_allocated(),
               host_peak_bytes=method.host_peak_bytes())
    gpu.stop()
    if kind == "torch_uvm":
        stats = torch_uvm.memory_stats()
        out.update(resident_units=len(handle.resident_units()), units=len(handle.units),
                   resident_bytes_peak=handle.residency_stats()["resident_bytes.peak"],
                   slot_reserved_peak_bytes=stats.get("slots.cuda:0.reserved_bytes.peak"))
    if kind in ("fsdp2_cpu_offload", "deepspeed_zero3_offload"):
        import torch.distributed as dist
        dist.destroy_process_group()
    return out


# ---------------------------------------------------------------- the report

def report(runs: dict, out_dir: str, tiny: bool) -> dict:
    """Prints the table and the ratios; writes the JSON and the plot."""
    rates = [r["h2d_gbps"] * 1e9 if r else None for r in runs.get("pinned_rate", [])]
    rounds = max(len(rs) for rs in runs.values())
    rates += [None] * (rounds - len(rates))
    resident = runs.get("resident", [])
    some = next((r for v, rs in runs.items() if v != "pinned_rate" for r in rs if r), None)
    weights = some["weights_bytes"] if some else None
    print(f"\nLlama-architecture {'tiny' if tiny else '7B'}"
          f"{' (deterministic kernels, eager attention)' if method.DETERMINISTIC else ''} "
          f"LoRA (rank 16, q k v o gate up down; "
          f"{gib_cell(some and some['trainable_bytes'])} GiB trainable), "
          f"{gib_cell(weights)} GiB of "
          f"parameters, sequence {128 if tiny else SEQ}, activation checkpointing; pinned H2D "
          f"{median_cell(method.summarize([r / 1e9 for r in rates if r]), '.1f')} GB/s")
    print("| variant | batch | tokens/s (median, min–max) | link limit, tokens/s | x the link "
          "limit (s/step) | x max(link, resident) | losses = all resident | process GPU, GiB: "
          "timed (run) | PyTorch's allocator's peak, GiB: allocated (reserved) | host peak, GiB | placing, s | first step, s | "
          "to the GPU a step, GiB (torch_uvm's books; the least) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    tables, compared = {}, {}
    for v, rs in runs.items():
        if v == "pinned_rate":
            continue
        rs = list(rs) + [None] * (rounds - len(rs))
        for b in map(str, BATCHES):
            ok = [r for r in rs if r]
            if not ok:
                print(f"| {v} | {b} | failed | | | | | | | | | | |")
                continue
            secs = [r["batches"][b]["s_per_step"] if r else None for r in rs]
            tokens = ok[0]["tokens_per_step"][b]
            budget = ok[0].get("budget_bytes")
            least = 2 * max(0, weights - budget) if budget else None
            limit_s = [least / h if least and h else None for h in rates]
            res_s = [r["batches"][b]["s_per_step"] if r else None for r in resident]
            bound = [max(x for x in (l, r) if x is not None) if (l or r) else None
                     for l, r in zip(limit_s, res_s + [None] * (rounds - len(res_s)))]
            x_link = method.ratio(secs, limit_s) if least else None
            x_bound = method.ratio(secs, bound, target=1.3) if v != "resident" else None
            ref = next((r["batches"][b]["losses"] for r in resident if r), None)
            check = method.outputs_check([r["batches"][b]["losses"] for r in ok], ref)
            exact = v.startswith(EXACT)
            row = {"tokens_per_s": method.summarize([tokens / s for s in secs if s]),
                   "s_per_step": method.summarize([s for s in secs if s]),
                   "link_limit_tokens_per_s": method.summarize(
                       [tokens / s for s in limit_s if s]) if least else None,
                   "x_link_limit": x_link, "x_max_link_resident": x_bound,
                   "least_bytes_per_step": least,
                   "to_gpu_bytes_per_step": ok[-1]["batches"][b].get("to_gpu_bytes_per_step"),
                   "same_losses": check["same"],
                   "losses_max_abs_difference": check["max_abs_difference"],
                   "first_loss_same": None if ref is None or b != str(BATCHES[0]) else all(
                       r["batches"][b]["losses"][0] == ref[0] for r in ok),
                   **{k: max(r["batches"][b][k] if k in r["batches"][b] else r[k] for r in ok)
                      for k in ("gpu_peak_timed_bytes", "gpu_peak_run_bytes",
                                "torch_reserved_peak_bytes", "torch_allocated_peak_bytes",
                                "host_peak_bytes")
                      if all(k in r or k in r["batches"][b] for r in ok)},   # (older runs lack some)
                   **{k: method.summarize([r[k] for r in ok])
                      for k in ("place_s", "first_step_s", "build_s")},
                   **{k: ok[-1][k] for k in ("budget_bytes", "bound_bytes",
                                             "process_gpu_at_start_bytes", "weights_bytes",
                                             "trainable_bytes",
                                             "units_option",
                                             "resident_units", "units", "resident_bytes_peak",
                                             "slot_reserved_peak_bytes", "fsdp2", "deepspeed")
                      if k in ok[-1]}}
            tables[f"{v}, batch {b}"] = row
            t = row["tokens_per_s"]
            first = ("" if row["first_loss_same"] is None else
                     "; first loss " + ("equal" if row["first_loss_same"] else "differs"))
            print(f"| {v} | {b} | {t['median']:.0f} ({t['min']:.0f}–{t['max']:.0f}) | "
                  f"{median_cell(row['link_limit_tokens_per_s'], '.0f')} | {median_cell(x_link)} | "
                  f"{median_cell(x_bound)} | {method.describe_check(check, exact)}"
                  f"{first} | "
                  f"{gib_cell(row['gpu_peak_timed_bytes'])} "
                  f"({gib_cell(row['gpu_peak_run_bytes'])}) | "
                  f"{gib_cell(row.get('torch_allocated_peak_bytes'))} "
                  f"({gib_cell(row['torch_reserved_peak_bytes'])}) | "
                  f"{gib_cell(row['host_peak_bytes'])} | "
                  f"{row['place_s']['median']:.1f} | {row['first_step_s']['median']:.2f} | "
                  f"{gib_cell(row['to_gpu_bytes_per_step'])} ({gib_cell(least)}) |")
            if row.get("bound_bytes"):    # the whole process against its bound
                method.report_bound(row, ok)
            if v.startswith("torch_uvm"):
                if x_link:
                    compared[f"{v}, batch {b}: s per step / link limit"] = x_link
                if x_bound:
                    compared[f"{v}, batch {b}: s per step / max(link limit, all resident)"] = \
                        x_bound
                for anchor in ("fsdp2_cpu_offload", "deepspeed_zero3_offload", "qlora_nf4"):
                    theirs = [r["batches"][b]["s_per_step"] if r else None
                              for r in runs.get(anchor, [])]
                    if any(theirs):
                        compared[f"{v}, batch {b}: s per step / {anchor}'s"] = method.ratio(
                            secs, theirs)
    method.print_comparisons(compared)
    for v, rs in runs.items():   # OFFLOAD_PROFILE: where the GPU's time went in one step
        for r in rs:
            if r and r.get("profile"):
                print(method.describe_profile(f"{v}, batch {BATCHES[0]}", r["profile"])
                      + f"\n  the step under the profiler: {r['profile']['wall_s']:.2f} s")
                break
    os.makedirs(out_dir, exist_ok=True)
    stem = "offload_lora_tiny" if tiny else "offload_lora"
    method.write(os.path.join(out_dir, stem + ".json"), compared, runs=runs, tables=tables,
                 tiny=tiny, seq=128 if tiny else SEQ, batches=list(BATCHES),
                 deterministic=method.DETERMINISTIC)
    plot(tables, os.path.join(out_dir, stem + ".png"), tiny)
    return compared


def plot(tables: dict, path: str, tiny: bool) -> None:
    """Speed for memory: tokens/s against the process's GPU memory over the
    timed steps, a point per variant, a panel per batch; the link limit of
    each budget as a dotted line."""
    plt = method.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(BATCHES), figsize=(6 * len(BATCHES), 4.5))
    for ax, b in zip(axes, BATCHES):
        for key, row in tables.items():
            if not key.endswith(f", batch {b}"):
                continue
            name = key[:-len(f", batch {b}")]
            t = row["tokens_per_s"]
            x = row["gpu_peak_timed_bytes"] / GiB
            ax.errorbar([x], [t["median"]],
                        yerr=[[t["median"] - t["min"]], [t["max"] - t["median"]]],
                        fmt="o", capsize=3, color="tab:blue" if name.startswith("torch_uvm") else
                        "tab:gray" if name == "resident" else "tab:orange")
            ax.annotate(name, (x, t["median"]), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
            lim = row["link_limit_tokens_per_s"]
            if lim:
                ax.axhline(lim["median"], color="k", ls=":", lw=0.8)
        for option, style in (("", "-"), *((u, "--") for u in UNITS)):
            curve = sorted((row["gpu_peak_timed_bytes"] / GiB, row["tokens_per_s"]["median"])
                           for key, row in tables.items()
                           if key.startswith("torch_uvm") and key.endswith(f", batch {b}")
                           and row.get("units_option", "") == option)
            if len(curve) > 1:     # torch_uvm's budgets, joined: its speed-for-memory curve
                ax.plot(*zip(*curve), color="tab:blue", lw=1, ls=style)
        ax.set_xlabel("process GPU memory over the timed steps, GiB (mem_get_info)")
        ax.set_ylabel("tokens/s")
        ax.set_yscale("log")
        ax.set_title(f"batch {b} x {128 if tiny else SEQ} tokens (dotted: link limits)")
    fig.suptitle(f"Llama {'tiny' if tiny else '7B'} LoRA rank 16: speed for GPU memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    method.process_driver(
        __file__, "Llama 7B LoRA: torch_uvm.offload at 4 and 8 GiB beside all-resident, FSDP2 "
        "and DeepSpeed, against the link's limit. Variants: " + ", ".join(VARIANTS)
        + "; opt-in: " + ", ".join(CURVE), VARIANTS, CURVE, run_variant, report, rounds=1,
        only="lora", timeout=400, argv=argv)


if __name__ == "__main__":
    main()
