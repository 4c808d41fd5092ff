"""Larger than the GPU, training (issue 20's (t) and (t2)), side by side with
the anchors, against the link's limit of the step.

    python benchmarks/offload_train.py [--rounds 2] [--only mlp,gpt2] [--out DIR]
    python benchmarks/offload_train.py --only llama7b --rounds 1 [--variants a,b]
    python benchmarks/offload_train.py --from DIR/offload_train.json --out DIR2
        (a run's table, ratios, JSON and plot again, with the limits as computed now)
    OFFLOAD_PROFILE=DIR: one more step of each torch_uvm variant (and all
        resident), profiled: where the GPU's time went in each phase, and how
        much of its idle time the thread feeding it waited for it
        (method.busy_times); OFFLOAD_PROFILE_CPU=1 records the host's
        operators and torch_uvm's ranges too (slower launches)

(t) mlp: 32 fp32 Linear(4096, 4096, bias=False) (2 GiB of weights; 8 GiB with
    gradients and AdamW's two moments), batch 256, AdamW, under a 1 GiB
    budget. Seconds per step. AdamW with fused=True throughout (one pass over
    the states: torch_uvm steps them in place in host memory).
(t2) gpt2: HF GPT-2 config, 24 layers, n_embd 2048 (1.2 B parameters; about
    19 GB of fp32 weights, gradients and AdamW states), batch 4 x 512 tokens,
    under a 4 GiB budget. Tokens per second.
(t3) llama (issue 35, point 2; only with --only llama): a full fine-tune of
    a Llama-architecture 3B (Llama-3.2-3B's shapes: 28 layers, hidden 3072,
    intermediate 8192, 24 heads, 8 key-value heads; vocabulary 32000; 3.0 G
    parameters, 12.1 GB of fp32 master weights, 48 GB with gradients and
    AdamW's moments), random weights built by offload_llama's builder (no
    second host copy), bf16 autocast, HF's activation checkpointing, batch
    4 x 1024 tokens, under an 8 GiB budget. Tokens per second; target 1.5x
    the least limit. OFFLOAD_TRAIN_TINY=1 runs it at a tiny shape. Its
    opt-in variants: torch_uvm_in_backward_<N>GiB (other budgets, each held
    to its own limit), torch_uvm_in_backward_host<S> (stream_optimizer's
    host_step=S: the last S of the streamed layers step on the host with
    PyTorch's fused CPU AdamW, as the third limit's placement does; with
    _nonblocking, optimizer.step() returns before the host's steps end and
    each layer's next forward waits for its own; with _copies<P>pct, the
    backward lets gradients of P% of the budget be copying home before it
    waits (TORCH_UVM_HOST_STEP_COPIES), not the default an eighth; with _threads<N>,
    the host steps on N threads, TORCH_UVM_HOST_STEP_THREADS) and
    torchtune_single_device, the memory savers users
    pick instead, rebuilt as torchtune's single-device recipe uses them
    (bf16 weights on the GPU, bitsandbytes' paged 8-bit AdamW stepped in
    backward, activation checkpointing): more memory, other arithmetic.
(t4) llama7b (only with --only llama7b): examples/recipes/full_7b.py beside
    its anchors on a 24 GB card: offload_llama's 7B (6.7 G parameters) with
    its weights and AdamW's states in bf16 (13.5 GB and 27 GB), no autocast,
    HF's activation checkpointing, batch 4 x 1024 tokens. torch_uvm runs as
    the recipe does, offload(gpu_memory="24GiB") stepping in backward; the
    limits take the budget that bound chose (its scenario's 14 GiB is the
    estimate of it). FSDP2's offload shards the bf16 weights as they are
    (its fused CPU AdamW in bf16: the same precision); DeepSpeed runs with
    its bf16 block (fp32 master weights and states: more host memory, more
    precision); torchtune's savers hold everything on the GPU (more memory).

Variants: all resident (in every run: each variant's losses are checked
against it); torch_uvm.offload with stream_optimizer (the step after
backward, and step_in_backward); PyTorch's FSDP2 with CPUOffloadPolicy
(world size 1: weights, gradients and states in pinned host memory, the step
on the CPU with torch.optim.AdamW(fused=True), PyTorch's fused CPU kernel),
and the same with torch_uvm.fsdp.step_in_backward (fsdp2_cpu_offload_uvm_steps:
each param group's fused CPU step on a worker thread as soon as its
gradients are home, beside the rest of the backward, the same arithmetic);
for the bf16-autocast llama also both with FSDP2's MixedPrecisionPolicy
(_bf16: bf16 gathered and computed, fp32 reduced, FSDP2's fastest form);
for the MLP also torchao's CPUOffloadOptimizer and bitsandbytes' PagedAdamW,
which keep the weights on the GPU (only the optimizer's states, and for
torchao the gradients, live in host memory); DeepSpeed ZeRO-3 (for the
llama also _bf16: its bf16 block, bf16 gathered and fp32 master states) with its
parameters and optimizer offloaded to the CPU (ZeRO-Infinity's placement at
world size 1: fp32 weights and AdamW states in pinned host memory, gathered
to the GPU per submodule, DeepSpeedCPUAdam), tuned as DeepSpeed's and
Hugging Face's docs tune it (pin_memory, overlap_comm, contiguous_gradients,
sub_group_size 1e9, buckets from the hidden size) with its live parameters
capped at the budget; and, given more memory, DeepSpeed's ZeRO-Offload
proper (stage 2: weights and gradients on the GPU, only the optimizer
offloaded). Variants marked "more memory" hold more than the budget on the
GPU. DeepSpeed is carried as wheels: built with DS_BUILD_OPS=0, its ops
compiled by ninja on first use.

Beside every figure, the process's peak host memory (ru_maxrss).

Losses: True/False says bit for bit equal to all-resident's where the
variant runs the same arithmetic (torch_uvm, GPT-2 only with
OFFLOAD_DETERMINISTIC=1); where it cannot by nature (a CPU step, another
optimizer kernel) the table gives the largest difference of the losses.

The link limit (headline) is the least any placement moves
(method.least_training_bytes): with W bytes of fp32 weights, AdamW's 2 W of
moments and a budget of B, each weight byte is streamed (to the GPU in both
passes, its gradient home to a CPU step: 2 in, 1 out), resident alone (its
gradient home, the stepped weight back: 1 in, 1 out, 1 byte of budget) or
resident with its moments (nothing crosses, 3 bytes of budget). With both
rates equal, B < W gives 2 W - B in and W out; W <= B < 3 W gives
(3 W - B) / 2 each way; both directions at once. The second limit, "with the
step on the GPU", is torch_uvm's own placement (the resident prefix its plan
chose, the step in backward on the GPU): streamed weights cross twice to the
GPU and once home, and every AdamW moment crosses both ways; for a
host_step variant, its own placement: the moments of the weights the host
steps stay home, and the host's fused AdamW takes its time beside the
link (its column then reads that limit). The third, the least any
placement takes on this host (method.least_step_s), adds the host's fused
CPU AdamW at its measured rate to the first's link; the fourth, printed
as a line and a ratio, also lets the copies both ways and the AdamW's 28
bytes a weight share the host's memory at the most it carried in the run
(method.host_memory_rate): an estimate, not a floor, since the memory may
carry more than it was seen to. Beside them, as a line and not a ratio:
the third and fourth were the weights' bf16 casts and their gradients to
cross in place of fp32 ones (method.PLACEMENTS_BF16_CASTS), a placement
torch_uvm does not take. Rates are the pinned_rate variant's in the
same round. Beside every figure, the process's GPU memory as the driver
sees it (method.ProcessGpuMemory), apart from torch_uvm's books.
"""
import argparse
import contextlib
import json
import os
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torch_uvm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # method
import floors  # noqa: E402
import method  # noqa: E402
import offload_llama  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
LINK = 55e9   # pinned copies, each way (FINDINGS.md): used only if pinned_rate did not run
# OFFLOAD_TRAIN_TINY=1: llama at offload_llama's tiny shape, its budget the
# same share of its weights, for a smoke test of every variant in seconds.
TINY = os.environ.get("OFFLOAD_TRAIN_TINY") == "1"
SCENARIOS = {   # hidden: the model's width, which DeepSpeed's bucket sizes follow
    "mlp": {"budget": 1 * GiB, "steps": 5, "lr": 1e-4, "hidden": 4096},
    "gpt2": {"budget": 4 * GiB, "steps": 5, "lr": 1e-4, "hidden": 2048},
    "llama": {"budget": 8 * GiB, "steps": 5, "lr": 1e-4, "hidden": 256 if TINY else 3072},
    # the budget gpu_memory="24GiB" chooses at batch 4 x 1024 (torch_uvm.estimate)
    "llama7b": {"budget": 14 * GiB, "steps": 4, "lr": 1e-5, "hidden": 256 if TINY else 4096,
                "element_bytes": 2},
}
TOKENS = ("gpt2", "llama", "llama7b")      # reported in tokens/s (the others in s / step)
LLAMAS = ("llama", "llama7b")              # offload_llama's builder: TINY applies
PLAN = {
    "mlp": ["pinned_rate", "resident", "torch_uvm", "torch_uvm_in_backward", "fsdp2_cpu_offload",
            "fsdp2_cpu_offload_uvm_steps",
            "torchao_cpu_offload", "bnb_paged_adamw", "deepspeed_zero_offload",
            "deepspeed_zero2_offload_more_memory", "torch_uvm_bound_3GiB_in_backward"],
    "gpt2": ["pinned_rate", "resident", "torch_uvm", "torch_uvm_in_backward", "fsdp2_cpu_offload",
             "fsdp2_cpu_offload_uvm_steps",
             "deepspeed_zero_offload", "deepspeed_zero2_offload_more_memory",
             "torch_uvm_in_backward_host1_nonblocking",
             "torch_uvm_in_backward_host1_nonblocking_copies1pct",
             "torch_uvm_bound_19GiB_in_backward_host1_nonblocking"],
    "llama": ["pinned_rate", "resident", "torch_uvm", "torch_uvm_in_backward",
              "torch_uvm_in_backward_host1", "torch_uvm_in_backward_host1_nonblocking",
              "torch_uvm_host1", "torch_uvm_host1_nonblocking",
              "torch_uvm_in_backward_host0.75",
              "torch_uvm_in_backward_host0.5",
              "fsdp2_cpu_offload", "fsdp2_cpu_offload_uvm_steps",
              "fsdp2_cpu_offload_bf16", "fsdp2_cpu_offload_bf16_uvm_steps",
              "deepspeed_zero_offload", "deepspeed_zero_offload_bf16",
              "deepspeed_zero2_offload_more_memory",
              "torch_uvm_in_backward_3GiB", "torch_uvm_in_backward_4GiB",
              "torch_uvm_in_backward_host1_4GiB", "torch_uvm_in_backward_host1_nonblocking_4GiB",
              "torch_uvm_in_backward_host1_nonblocking_copies1pct",
              "torch_uvm_in_backward_host1_nonblocking_copies25pct",
              "torch_uvm_in_backward_host1_nonblocking_threads8",
              "torch_uvm_in_backward_host1_nonblocking_threads10",
              "torchtune_single_device",
              "torch_uvm_bound_14GiB_in_backward_host1_nonblocking"],
    # examples/recipes/full_7b.py on a 24 GB card beside its anchors: the
    # anchors that need no more memory than the card first, then the savers
    "llama7b": ["pinned_rate", "resident", "torch_uvm_bound_24GiB_in_backward",
                "torch_uvm_bound_24GiB_in_backward_host1_nonblocking",
                "torch_uvm_bound_8GiB_in_backward_host1_nonblocking",
                "fsdp2_cpu_offload", "deepspeed_zero_offload_bf16", "torchtune_single_device"],
}
# A variant named <variant>_<N>GiB runs under N GiB instead of the scenario's
# budget: torch_uvm's speed for memory beside the anchors' points. One named
# torch_uvm_bound_<G>GiB_<variant> runs offload(gpu_memory=G GiB) instead (a
# bound on the whole process, issue 55; the MLP's planned from its inputs): G is
# about the whole process the budget's run took, CUDA's start included.
# The same arithmetic as all-resident's: their losses can equal it bit for
# bit. The others step on the CPU or with their own kernels.
EXACT = ("resident", "torch_uvm")     # and every torch_uvm variant (a prefix)


def exact(variant: str) -> bool:
    """Whether the variant runs all-resident's arithmetic (a host step is
    PyTorch's fused CPU AdamW: not)."""
    return variant.startswith(EXACT) and not method.variant_host_step(variant)


# FSDP2's offload with torch_uvm's host steps in backward, and FSDP2's own.
UVM_STEPS = {"fsdp2_cpu_offload_uvm_steps": "fsdp2_cpu_offload",
             "fsdp2_cpu_offload_bf16_uvm_steps": "fsdp2_cpu_offload_bf16"}
# Hold more than the budget on the GPU (the weights at least).
MORE_MEMORY = ("torchao_cpu_offload", "bnb_paged_adamw", "deepspeed_zero2_offload_more_memory",
               "torchtune_single_device")
MLP_LAYERS, MLP_WIDTH, MLP_BATCH = 32, 4096, 256
DETERMINISTIC = method.DETERMINISTIC    # OFFLOAD_DETERMINISTIC=1 (method.py)
GPT_BATCH, GPT_SEQ = 4, 512
LLAMA_BATCH, LLAMA_SEQ = 4, 1024
SHAPE = {"llama": "3b", "llama7b": "7b"}     # offload_llama.SHAPES


def element_bytes(scenario) -> int:
    """The bytes of one of the scenario's weights (fp32 unless it says)."""
    return SCENARIOS[scenario].get("element_bytes", 4)


def own_budget(scenario, variant: str, run: Optional[dict]) -> int:
    """The budget a variant's run streamed under: the one its gpu_memory
    chose (a bound variant's run records it), else budget()."""
    return (run or {}).get("budget_bytes") or budget(scenario, variant)


def budget(scenario, variant: str = "") -> int:
    """The variant's budget (its _<N>GiB, else the scenario's); for the tiny
    llama, the same share of its weights."""
    gib = None if method.variant_bound_gib(variant) else method.variant_gib(variant)
    b = SCENARIOS[scenario]["budget"] if gib is None else int(gib * GiB)
    if scenario in LLAMAS and TINY:
        b = int(b * offload_llama.weights_bytes(offload_llama.llama_config(True))
                / offload_llama.weights_bytes(offload_llama.llama_config(shape=SHAPE[scenario])))
    return b


def build(scenario):
    import torch
    torch.manual_seed(0)
    if scenario == "mlp":
        model = torch.nn.Sequential(*[torch.nn.Linear(MLP_WIDTH, MLP_WIDTH, bias=False)
                                      for _ in range(MLP_LAYERS)])
        # unit gain per layer: with PyTorch's default init each layer scales
        # activations by 1/sqrt(3), the output of 32 is ~1e-8, the updates
        # vanish below fp32's precision, and only weight decay moved the loss
        for layer in model:
            torch.nn.init.normal_(layer.weight, std=MLP_WIDTH ** -0.5)
        x = torch.randn(MLP_BATCH, MLP_WIDTH, generator=torch.Generator().manual_seed(1))

        def loss_fn(m, x):
            return m(x).square().mean()
        return model, x, loss_fn
    if scenario in LLAMAS:
        return build_llama(scenario)
    from transformers import GPT2Config, GPT2LMHeadModel
    # deterministic: eager attention (SDPA's backward kernels accumulate with atomics)
    config = GPT2Config(n_embd=2048, n_layer=24, n_head=16, n_positions=GPT_SEQ,
                        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                        **({"attn_implementation": "eager"} if DETERMINISTIC else {}))
    model = GPT2LMHeadModel(config)
    x = torch.randint(0, config.vocab_size, (GPT_BATCH, GPT_SEQ),
                      generator=torch.Generator().manual_seed(1))

    def loss_fn(m, x):
        return m(input_ids=x, labels=x).loss
    return model, x, loss_fn


def build_llama(scenario: str = "llama"):
    """A full fine-tune as users write one: the Llama (offload_llama's
    builder, no second host copy), HF's activation checkpointing
    (non-reentrant), batch 4 x 1024 tokens. "llama": the 3B in fp32 master
    weights under bf16 autocast. "llama7b" (examples/recipes/full_7b.py's
    training): the 7B with its weights, and so AdamW's states, in bf16 (as
    torchtune's single-device recipes train), no autocast."""
    import torch
    autocast = scenario == "llama"
    extra = {"attn_implementation": "eager"} if DETERMINISTIC else {}
    model = offload_llama.build(TINY, shape=SHAPE[scenario],
                                dtype=torch.float32 if autocast else torch.bfloat16, **extra)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    x = torch.randint(0, model.config.vocab_size, (LLAMA_BATCH, LLAMA_SEQ),
                      generator=torch.Generator().manual_seed(1))

    def loss_fn(m, x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            return m(input_ids=x, labels=x).loss
    return model, x, loss_fn


def torchtune_single_device(model, lr):
    """The memory savers of torchtune's single-device full fine-tune recipe,
    rebuilt from the same pieces: the weights in bf16 (no fp32 master copy),
    all on the GPU; bitsandbytes' paged 8-bit AdamW, one per parameter,
    stepped in backward as each gradient is complete and the gradient then
    dropped (torchtune's optimizer_in_bwd); activation checkpointing (the
    model has it on). Returns the model and an optimizer whose step and
    zero_grad do nothing (backward did both)."""
    import bitsandbytes as bnb
    import torch
    model = model.to(torch.bfloat16).cuda()
    per_param = {p: bnb.optim.PagedAdamW8bit([p], lr=lr) for p in model.parameters()}

    def step_now(p):
        per_param[p].step()
        per_param[p].zero_grad(set_to_none=True)
    for p in per_param:
        p.register_post_accumulate_grad_hook(step_now)

    class InBackward:
        def step(self):
            pass

        def zero_grad(self):
            pass
    return model, InBackward()


def shard(model, offload: bool = True, bf16: bool = False, pin_memory: bool = True,
          mesh=None):
    """fully_shard on each block of `model` and on the root (the process
    group made): with CPUOffloadPolicy where `offload`, and with `bf16`
    FSDP2's MixedPrecisionPolicy too (bf16 gathered and computed, fp32
    reduced), the fastest form for a bf16-autocast fine-tune (no fp32 casts
    cached). fsdp_offload.py shards its ranks with it too. `mesh`: FSDP2's
    (default: a mesh of the GPUs where CUDA is, which ranks on the CPU must
    not take: a machine with fewer GPUs than ranks refuses it)."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    blocks = (model.transformer.h if hasattr(model, "transformer")
              else model.model.layers if hasattr(model, "model") else list(model))
    options = {"offload_policy": CPUOffloadPolicy(pin_memory=pin_memory)} if offload else {}
    if mesh is not None:
        options["mesh"] = mesh
    if bf16:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                    reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def fsdp2(model, bf16: bool = False):
    """FSDP2 with CPUOffloadPolicy at world size 1 (shard())."""
    import torch
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    return shard(model, bf16=bf16)


def deepspeed_config(stage: int, budget: int, hidden: int, lr: float, bf16: bool = False) -> dict:
    """DeepSpeed's settings as its docs tune offload (the ZeRO-3 offload
    examples of DeepSpeed's and Hugging Face's DeepSpeed pages): pinned host
    memory, communication overlapped, gradients contiguous, sub_group_size
    1e9, the buckets from the hidden size (what "auto" fills in: hidden^2 to
    reduce, 0.9 hidden^2 to prefetch, 10 hidden kept resident). Stage 3
    offloads the parameters too, with the live parameters capped at the
    budget's fp32 elements (equal memory); stage 2 offloads only the
    optimizer (ZeRO-Offload proper: weights and gradients on the GPU). With
    the optimizer offloaded, the AdamW below runs as DeepSpeedCPUAdam."""
    zero = {
        "stage": stage,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": int(1e9),
        "reduce_bucket_size": hidden * hidden,
    }
    if stage == 3:
        zero.update({
            "offload_param": {"device": "cpu", "pin_memory": True},
            "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
            "stage3_max_live_parameters": budget // 4,   # fp32 elements in the budget
            "stage3_max_reuse_distance": int(1e9),
        })
    config = {
        "train_micro_batch_size_per_gpu": 1,
        # torch.optim.AdamW's defaults (DeepSpeed's weight_decay is 0)
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}},
        "zero_optimization": zero,
    }
    if bf16:     # bf16 weights gathered and computed, fp32 master weights and states
        config["bf16"] = {"enabled": True}
    return config


def deepspeed_zero_offload(model, config):
    """DeepSpeed's engine at world size 1 with `config`."""
    import deepspeed
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29534"), ("RANK", "0"),
                       ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    return engine


def train_step(variant, model, optimizer, loss, marks=None) -> None:
    """The backward and the step of `loss`: a DeepSpeed variant's engine's
    own (it zeroes the gradients), else the optimizer's, then zero_grad.
    `marks`, a list, gets time.perf_counter() when the backward returns."""
    if variant.startswith("deepspeed"):
        model.backward(loss)
    else:
        loss.backward()
    if marks is not None:
        marks.append(time.perf_counter())
    if variant.startswith("deepspeed"):
        model.step()
    else:
        optimizer.step()
        optimizer.zero_grad()


def run(scenario, variant):
    """One variant in this process: its result, with the process's GPU memory
    measured by the driver around everything that touches the GPU."""
    if variant == "pinned_rate":
        return {**method.pinned_rate(), **method.host_adamw_rate(), **method.shared_host_rates()}
    method.deterministic_kernels()
    return method.with_process_gpu_memory(lambda: measure(scenario, variant),
                                          uvm=variant.startswith("torch_uvm"))


def measure(scenario, variant):
    import torch
    conf = SCENARIOS[scenario]
    uvm = variant.startswith("torch_uvm")
    if uvm:
        import torch_uvm
    model, x, loss_fn = build(scenario)
    x = x.cuda()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    extra, handle = {}, None
    if variant == "resident":
        model.cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=conf["lr"], fused=True)
    elif uvm:
        copies, threads = method.variant_copies_share(variant), method.variant_threads(variant)
        if copies is not None:   # the gradients copying home in backward, a share of the budget
            os.environ[torch_uvm.host_step.COPIES_VARIABLE] = str(copies)
        if threads is not None:  # the host step's threads (read at its first step)
            os.environ[torch_uvm.host_step.THREADS_VARIABLE] = str(threads)
        bound = method.variant_bound_gib(variant)
        if bound is None:
            handle = torch_uvm.offload(model, budget=budget(scenario, variant), device="cuda")
        else:               # (gpu_memory gives back what building the model left cached;
            # a module with no Hugging Face config, the MLP, is planned from its inputs)
            shape = dict(inputs=x) if scenario == "mlp" else dict(batch=x.shape[0],
                                                                   seq=x.shape[1])
            handle = torch_uvm.offload(model, gpu_memory=int(bound * GiB), device="cuda",
                                       **shape)
            extra.update(bound_bytes=int(bound * GiB), budget_bytes=handle.state.bound.budget)
        optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=conf["lr"], fused=True),
                                            step_in_backward="in_backward" in variant,
                                            host_step=method.variant_host_step(variant),
                                            non_blocking="_nonblocking" in variant)
    elif variant.startswith("fsdp2_cpu_offload"):
        model = fsdp2(model, bf16="_bf16" in variant)
        # the parameters are pinned CPU DTensors: fused=True is PyTorch's
        # fused CPU AdamW (since 2.4), its fastest CPU step
        optimizer = torch.optim.AdamW(model.parameters(), lr=conf["lr"], fused=True)
        if variant.endswith("_uvm_steps"):     # each group steps on the host in backward
            import torch_uvm.fsdp
            extra["shard_steps"] = torch_uvm.fsdp.step_in_backward(model, optimizer).names
        extra["optimizer"] = {"class": "torch.optim.AdamW",
                              "fused": optimizer.defaults.get("fused"),
                              "params_on": str(next(model.parameters()).device)}
    elif variant == "torchao_cpu_offload":
        from torchao.optim import CPUOffloadOptimizer
        model.cuda()
        optimizer = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW,
                                        offload_gradients=True, lr=conf["lr"], fused=True)
    elif variant == "torchtune_single_device":
        model, optimizer = torchtune_single_device(model, conf["lr"])
        extra["optimizer"] = {"class": "bitsandbytes.optim.PagedAdamW8bit", "in_backward": True,
                              "params": "bfloat16"}
    elif variant == "bnb_paged_adamw":
        import bitsandbytes as bnb
        model.cuda()
        optimizer = bnb.optim.PagedAdamW(model.parameters(), lr=conf["lr"])
    elif variant.startswith("deepspeed"):
        config = deepspeed_config(2 if variant == "deepspeed_zero2_offload_more_memory" else 3,
                                  budget(scenario), conf["hidden"], conf["lr"],
                                  bf16=variant.endswith("_bf16"))
        model, optimizer = deepspeed_zero_offload(model, config), None   # (its engine steps)
        extra["optimizer"] = {"class": type(getattr(model, "basic_optimizer", None)).__name__,
                              "zero_optimization": config["zero_optimization"]}

    def backward_and_step(loss):
        train_step(variant, model, optimizer, loss)
    losses, times = [], []
    before = None
    for step in range(conf["steps"]):
        if step == 1 and handle is not None:
            torch.cuda.synchronize()
            before = handle.residency_stats()
            host_before = handle.host_step_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = loss_fn(model, x)
        backward_and_step(loss)
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    if handle is not None:   # (non_blocking: a step's host steps end in the next one's forward)
        handle.wait_for_host_steps()
    torch.cuda.synchronize()
    steady = sorted(times[1:])
    if handle is not None:      # the timed steps' (before a profiled one)
        after, host_after = handle.residency_stats(), handle.host_step_stats()
    where = os.environ.get("OFFLOAD_PROFILE")   # a folder: one more step, profiled
    if where and (variant in ("resident", "torch_uvm", "torch_uvm_in_backward")
                  or uvm and method.variant_host_step(variant)):
        os.makedirs(where, exist_ok=True)

        marks = []

        @contextlib.contextmanager
        def phase(name):   # marked, for where its time went (method.busy_times)
            start = time.time_ns()
            yield
            torch.cuda.synchronize()
            marks.append((f"phase::{name}", start, time.time_ns()))

        def one_step():
            with phase("forward"):
                loss = loss_fn(model, x)
            with phase("backward"):
                loss.backward()
            with phase("step"):
                optimizer.step()
                optimizer.zero_grad()

        def spans():
            host = [(f"torch_uvm::host_step {n}", a, b) for n, a, b in handle.state.host_steps.spans()] \
                if uvm else []
            return marks + host
        trace = os.path.join(where, f"{scenario}_{variant}.json")
        recorded = {}

        def step_recorded():   # torch_uvm's residency timeline of the same step
            with torch_uvm.profile() as recorded["timeline"]:
                one_step()
                torch.cuda.synchronize()
        # the host's operators not recorded: recording them slows the launches
        # timed (OFFLOAD_PROFILE_CPU=1 records them, and torch_uvm's ranges)
        extra["profile"] = method.profiled(step_recorded if uvm else one_step, trace,
                                           spans=spans,
                                           cpu_ops=os.environ.get("OFFLOAD_PROFILE_CPU") == "1")
        if uvm:
            timeline, stem = recorded["timeline"], trace[:-len(".json")]
            timeline.export_chrome_trace(stem + "_with_residency.json", merge_with=trace)
            timeline.to_json(stem + "_residency.json")
            try:
                timeline.plot(stem + "_residency.png")
            except RuntimeError as e:      # no matplotlib
                print(e)
            extra["residency_peaks"] = timeline.peaks()
    if handle is not None:
        extra["units_in_order"] = [u.name for u in handle.units_in_order()]
        n = conf["steps"] - 1
        resident = handle.resident_units()
        extra["host_stepped_bytes"] = sum(u.trainable_bytes for u in handle.host_stepped_units())
        extra["host_step_per_step"] = {k: (host_after[k] - host_before[k]) / (conf["steps"] - 1)
                                       for k in host_after}
        # what it ran with (the variables a variant or the caller set); an older
        # tree (trees.py) may keep them elsewhere, and then records none
        steps = getattr(getattr(handle, "state", None), "host_steps", None)
        if handle.host_step and steps is not None:
            extra["host_step_settings"] = {"copies_share": steps.copies_share,
                                           "threads": steps.threads}
        extra.update({"peak_resident_bytes": after["resident_bytes.peak"],
                 "resident_units": len(resident), "units": len(handle.units),
                 "resident_weight_bytes": sum(u.nbytes for u in resident),
                 "to_gpu_bytes_per_step": (after["prefetched_bytes"] - before["prefetched_bytes"]) / n,
                 "home_bytes_per_step": (after["evicted_bytes.write_home"]
                                         - before["evicted_bytes.write_home"]) / n,
                 "evictions": {k: after[k] - before[k] for k in after if k.startswith("evict")}})
    extra["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    if handle is not None:   # the slots' device memory, measured apart from the budget's books
        stats = torch_uvm.memory_stats()
        extra["slot_bytes_peak"] = stats["slots.cuda:0.reserved_bytes.peak"]
        extra["slot_allocated_bytes_peak"] = stats["slots.cuda:0.allocated_bytes.peak"]
    if variant.startswith(("fsdp2_cpu_offload", "deepspeed")):
        import torch.distributed as dist
        dist.destroy_process_group()
    extra["host_peak_bytes"] = method.host_peak_bytes()
    return {"s_per_step": steady[len(steady) // 2], "first_step_s": times[0], "losses": losses,
            "weights_bytes": weights, "tokens_per_step": x.numel() if scenario in TOKENS else None,
            **extra}


LEAST = "the least any placement moves"
ON_GPU = "with the step on the GPU"
HOST = "the least any placement takes on this host"
SHARED = "the least on this host, its memory shared"
CASTS = "the least on this host were bf16 casts to cross"
TOGETHER = "the least on this host at the rates seen together"


def link_limit(weights: int, resident: int, h2d: float, d2h: float, host: int = 0,
               host_elements_per_s: Optional[float] = None,
               host_memory_bytes_per_s: Optional[float] = None) -> dict:
    """The second limit, torch_uvm's placement: the step's bytes each way
    with the step in backward, and the seconds they take at the pinned
    rates (bytes/s), both ways at once. `host` of the streamed weight bytes
    step on the host (host_step): their moments stay there (their gradients
    go home where a GPU step's weights do), and the host's fused AdamW
    takes them at `host_elements_per_s`, beside the link. With
    `host_memory_bytes_per_s` (method.host_memory_rate), the copies both
    ways and that AdamW also share the host's memory, as in
    method.least_step_s: an estimate, not a floor."""
    streamed = weights - resident
    moments = 2 * (weights - host)               # AdamW: two fp32 moments per GPU-stepped weight
    to_gpu = 2 * streamed + moments
    home = streamed + moments
    host_s = host / 4 / host_elements_per_s if host and host_elements_per_s else 0.0
    memory_s = ((to_gpu + home + method.ADAMW_HOST_MEMORY * host) / host_memory_bytes_per_s
                if host_memory_bytes_per_s else 0.0)
    return {"to_gpu_bytes": to_gpu, "home_bytes": home, "h2d_gbps": h2d / 1e9,
            "d2h_gbps": d2h / 1e9, "host_step_bytes": host, "host_step_s": host_s,
            "host_memory_s": memory_s,
            "seconds": max(to_gpu / h2d, home / d2h, host_s, memory_s)}


def least_limit(weights: int, budget: int, h2d: float, d2h: float, casts: bool = False) -> dict:
    """The headline limit, the least any placement moves (method.py), in the
    shape of link_limit's answer. `casts` (a scenario under bf16 autocast):
    the least over every placement, the weights' bf16 casts crossing for a
    host step among them (method.PLACEMENTS_BF16_CASTS, the host stepping
    for free), which moves less than any fp32 one."""
    if not casts:
        return {**method.least_training_bytes(weights, budget, h2d, d2h),
                "h2d_gbps": h2d / 1e9, "d2h_gbps": d2h / 1e9,
                "seconds": method.least_training_limit_s(weights, budget, h2d, d2h)}
    ways = method.PLACEMENTS_BF16_CASTS
    found = method.least_step_s(weights, budget, h2d, d2h, floors.FREE, placements=ways)
    moved = lambda k: round(sum(b * ways[n][k] for n, b in found["mix_bytes"].items()))  # noqa: E731
    return {"to_gpu_bytes": moved(0), "home_bytes": moved(1), "mix_bytes": found["mix_bytes"],
            "bf16_casts": True, "h2d_gbps": h2d / 1e9, "d2h_gbps": d2h / 1e9,
            "seconds": found["seconds"]}


AUTOCAST = ("llama",)     # the scenarios that train under bf16 autocast


def host_rate(runs) -> Optional[float]:
    """The host's fused CPU AdamW, fp32 elements a second, as pinned_rate
    measured it (the median of its rounds), or None."""
    return method.median_of([r for r in runs.get("pinned_rate", [])
                             if r and "host_adamw_elements_per_s" in r],
                            "host_adamw_elements_per_s", None)


def host_memory(runs) -> Optional[float]:
    """The most the host's memory carried at once (method.host_memory_rate),
    the median over pinned_rate's rounds, or None."""
    memories = [m for m in (method.host_memory_rate(r) for r in runs.get("pinned_rate", []) if r)
                if m]
    return method.summarize(memories)["median"] if memories else None


def host_limit(weights: int, budget_bytes: int, h2d: float, d2h: float, runs,
               shared: bool = False, placements: Optional[dict] = None,
               element_bytes: int = 4) -> Optional[dict]:
    """The third limit, the least any placement takes with this host
    (method.least_step_s): the link's bytes as in the first, and the
    weights the host steps at the fused CPU AdamW rate pinned_rate
    measured. The GPU's compute is not counted (all resident's step holds
    a GPU AdamW that a host step skips, so it is no floor), nor bf16 casts
    crossing in place of fp32 weights (as in the first). `shared`, the
    fourth: the link's copies and the host's AdamW also share the host's
    memory at the most it carried in this run (method.host_memory_rate,
    the median over rounds). `placements`: method.least_step_s's (the
    weights' bf16 casts crossing: method.PLACEMENTS_BF16_CASTS). None
    where pinned_rate did not measure what it needs. `element_bytes`: the
    weights' (a bf16 model's AdamW steps at the fp32 rate measured an
    element: an estimate)."""
    rate = host_rate(runs)
    memory = host_memory(runs) if shared else None
    if not rate or (shared and not memory):
        return None
    found = method.least_step_s(weights, budget_bytes, h2d, d2h, element_bytes * rate,
                                host_memory_bytes_per_s=memory, placements=placements)
    return {**found, "host_adamw_elements_per_s": rate,
            **({"host_memory_gbps": memory / 1e9} if shared else {})}


def together_rates(runs) -> Optional[dict]:
    """The median, over the pinned_rate rounds that measured the shared
    rates, of each rate floors.regimes reads (the solo ones of those same
    rounds), or None where no round measured them."""
    measured = [r for r in runs.get("pinned_rate", []) if r and "both_ways_h2d_gbps" in r]
    if not measured:
        return None
    return {k: method.summarize([r[k] for r in measured])["median"] for k in floors.RATE_KEYS}


def limits(scenario, runs, rounds):
    """Both limits at the median rates, and each round's, for ratios paired
    with the runs of the same round (None where nothing ran to size them)."""
    limit_budget = budget(scenario)
    some = next((r for v, rs in runs.items() if v != "pinned_rate" for r in rs if r), None)
    uvm_run = next((r for r in runs.get("torch_uvm_in_backward", []) if r), None)
    rate_runs = runs.get("pinned_rate", [])
    h2ds = method.round_rates(rate_runs, "h2d_gbps", rounds, LINK)
    d2hs = method.round_rates(rate_runs, "d2h_gbps", rounds, LINK)
    h2d = method.summarize(h2ds)["median"]
    d2h = method.summarize(d2hs)["median"]
    out = {"measured": any(rate_runs), "least": None, "on_gpu": None, "host": None,
           "shared": None, "casts": None, "casts_shared": None, "together": None,
           "together_casts": None,
           "least_s": [None] * rounds, "on_gpu_s": [None] * rounds,
           "host_s": [None] * rounds, "shared_s": [None] * rounds}
    if some:
        w = some["weights_bytes"]
        casts = scenario in AUTOCAST
        out["least"] = least_limit(w, limit_budget, h2d, d2h, casts)
        out["least_s"] = [least_limit(w, limit_budget, h, d, casts)["seconds"]
                          for h, d in zip(h2ds, d2hs)]
        e = element_bytes(scenario)
        for key, shared in (("host", False), ("shared", True)):
            out[key] = host_limit(w, limit_budget, h2d, d2h, runs, shared, element_bytes=e)
            if out[key]:
                out[f"{key}_s"] = [host_limit(w, limit_budget, h, d, runs, shared,
                                              element_bytes=e)["seconds"]
                                   for h, d in zip(h2ds, d2hs)]
            if casts:   # (bf16 autocast; beside them, not a ratio: a placement
                # torch_uvm does not take)
                out["casts_shared" if shared else "casts"] = host_limit(
                    w, limit_budget, h2d, d2h, runs, shared, method.PLACEMENTS_BF16_CASTS)
        rates = together_rates(runs)
        if rates:
            out["together"] = floors.least_step_together_s(w, limit_budget, rates)
            if casts:
                out["together_casts"] = floors.least_step_together_s(
                    w, limit_budget, rates, ways=method.PLACEMENTS_BF16_CASTS)
    if uvm_run:
        w, r = uvm_run["weights_bytes"], uvm_run["resident_weight_bytes"]
        out["on_gpu"] = link_limit(w, r, h2d, d2h)
        out["on_gpu_s"] = [link_limit(w, r, h, d)["seconds"] for h, d in zip(h2ds, d2hs)]
    return out


def placing(found: dict) -> str:
    """The mix of placements a least found, in GiB of weights each."""
    return ", ".join(f"{n} {b / GiB:.2f} GiB" for n, b in found["mix_bytes"].items())


def describe_limit(limit):
    if not limit:
        return "unknown"
    return (f"{limit['to_gpu_bytes'] / GiB:.2f} GiB to the GPU, {limit['home_bytes'] / GiB:.2f} "
            f"GiB home = {limit['seconds']:.3f} s")


def settings_note(settings: Optional[dict]) -> str:
    """What a host step ran with (measure's host_step_settings), for its
    line of the report: the share of the budget its gradients copying home
    could take, and its threads; nothing for a run that did not say."""
    if not settings:
        return ""
    return (f" (gradients copying home up to {settings['copies_share']:.3g} of the budget; "
            f"{settings['threads']} threads)")


def report(scenario, runs, rounds):
    ref = next((r["losses"] for r in runs.get("resident", []) if r), None)
    lim = limits(scenario, runs, rounds)
    least, on_gpu, host = lim["least"], lim["on_gpu"], lim["host"]
    rates = (f"pinned {least['h2d_gbps']:.1f} GB/s to the GPU and {least['d2h_gbps']:.1f} home, "
             f"{'measured in this run' if lim['measured'] else 'assumed: pinned_rate did not run'}"
             if least else "no run")
    name = {"mlp": "(t) mlp", "gpt2": "(t2) gpt2",
            "llama": f"(t3) Llama-architecture {'tiny' if TINY else '3B'}, full fine-tune",
            "llama7b": f"(t4) Llama-architecture {'tiny' if TINY else '7B'}, full fine-tune "
                       f"in bf16 (weights and AdamW's states), examples/recipes/full_7b.py's"}
    print(f"\n{name[scenario]}"
          f"{', deterministic kernels' if DETERMINISTIC else ''}, budget "
          f"{budget(scenario) / GiB:.3g} GiB, AdamW; {rates}")
    if least and least.get("bf16_casts"):
        print(f"link limit, {LEAST} (over every placement, AdamW's moments counted, the "
              f"weights' bf16 casts crossing for a host step among them: what autocast "
              f"computes with; the host stepping for free): {describe_limit(least)}")
    else:
        print(f"link limit, {LEAST} (AdamW's moments counted: the weights the budget cannot "
              f"hold to the GPU in both passes, every gradient of a weight not resident with "
              f"its moments home and its weight back): {describe_limit(least)}")
    print(f"link limit {ON_GPU} (torch_uvm's placement, step in backward, AdamW's moments "
          f"crossing too): {describe_limit(on_gpu)}")
    if host:
        print(f"{HOST} (the link as above, the weights the host steps at its fused CPU AdamW's "
              f"solo rate, {host['host_adamw_elements_per_s'] / 1e9:.2f} G elements/s, at once "
              f"with the link's solo rates; the best "
              f"mix of placements; the GPU's compute not counted): "
              f"{host['seconds']:.3f} s, placing "
              + placing(host))
    shared = next((r for r in runs.get("pinned_rate", []) if r and "both_ways_h2d_gbps" in r), None)
    if shared:
        print(method.describe_shared_host(shared))
    if lim["shared"]:
        print(f"{SHARED} (the third, and every byte crossing the link either way and "
              f"{4 * method.ADAMW_HOST_MEMORY} bytes a weight the host steps through the host's "
              f"memory, at the most it carried here, {lim['shared']['host_memory_gbps']:.0f} "
              f"GB/s: an estimate, not a floor): {lim['shared']['seconds']:.3f} s, placing "
              + placing(lim["shared"]))
    if lim["casts"]:
        print(f"{CASTS} (the third{' and fourth' if lim['casts_shared'] else ''}, the "
              f"weights' bf16 casts and their gradients crossing in place of fp32 weights and "
              f"gradients: what autocast computes with; a placement torch_uvm does not take): "
              f"{lim['casts']['seconds']:.3f} s (placing {placing(lim['casts'])})"
              + (f"; {lim['casts_shared']['seconds']:.3f} s with its memory shared (placing "
                 f"{placing(lim['casts_shared'])})" if lim["casts_shared"] else ""))
    if lim["together"]:
        print(f"{TOGETHER} (floors.py: the link's two ways and the host's AdamW in the "
              f"combinations this run measured, at those rates; the forward's reads in the "
              f"forward, the backward's in the backward; the GPU's compute not counted; an "
              f"estimate, not a floor): {lim['together']['seconds']:.3f} s, placing "
              + placing(lim["together"])
              + (f"; {lim['together_casts']['seconds']:.3f} s were bf16 casts to cross"
                 if lim["together_casts"] else ""))
    unit = "tokens/s" if scenario in TOKENS else "s / step"
    print(f"| variant | {unit} (median of rounds; min-max) | x the link limit ({LEAST}) | "
          f"x the link limit {ON_GPU} (a host_step variant: its own placement's) | x {HOST} | "
          "losses = all resident | "
          "process GPU memory (peak, mem_get_info) | to GPU / home per step (torch_uvm) | "
          "max_memory_allocated (torch_uvm: + its slots' reserved peak) | host peak, GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    table = {}
    for v, rs in runs.items():
        if v == "pinned_rate":
            continue
        name = f"{v} (more memory)" if v in MORE_MEMORY else v
        ok = [r for r in rs if r]
        if not ok:
            print(f"| {name} | failed | | | | | | | | |")
            continue
        if scenario in TOKENS:
            vals = [r["tokens_per_step"] / r["s_per_step"] for r in ok]
        else:
            vals = [r["s_per_step"] for r in ok]
        t = method.summarize(vals)
        secs = method.summarize([r["s_per_step"] for r in ok])
        # the limits bound placements within the budget: not all-resident,
        # nor the variants that hold the weights on the GPU
        bounded = v != "resident" and v not in MORE_MEMORY
        own_least, own_on_gpu, own_host = least, on_gpu, host
        # a variant's own budget (under gpu_memory: the one the bound chose)
        chosen = own_budget(scenario, v, ok[-1])
        if least and chosen != budget(scenario):
            h, d = least["h2d_gbps"] * 1e9, least["d2h_gbps"] * 1e9
            own_least = least_limit(ok[-1]["weights_bytes"], chosen, h, d,
                                    scenario in AUTOCAST)
            own_host = host_limit(ok[-1]["weights_bytes"], chosen, h, d, runs,
                                  element_bytes=element_bytes(scenario))
            own_on_gpu = link_limit(ok[-1]["weights_bytes"], ok[-1]["resident_weight_bytes"],
                                    h, d) if "resident_weight_bytes" in ok[-1] else None
        own_shared = None
        if least and ok[-1].get("host_stepped_bytes"):     # its own placement, the host's part in
            h, d = least["h2d_gbps"] * 1e9, least["d2h_gbps"] * 1e9
            placed = (ok[-1]["weights_bytes"], ok[-1]["resident_weight_bytes"], h, d,
                      ok[-1]["host_stepped_bytes"], host_rate(runs))
            own_on_gpu = link_limit(*placed)
            memory = host_memory(runs)
            if memory:                  # and its bytes through the host's memory
                own_shared = link_limit(*placed, host_memory_bytes_per_s=memory)
        x_least = secs["median"] / own_least["seconds"] if own_least and bounded else None
        x_on_gpu = secs["median"] / own_on_gpu["seconds"] if own_on_gpu and bounded else None
        x_host = secs["median"] / own_host["seconds"] if own_host and bounded else None
        check = method.outputs_check([r["losses"] for r in ok], ref)
        gpu = [r.get("process_gpu_memory") for r in ok]
        moved = (f"{ok[-1]['to_gpu_bytes_per_step'] / GiB:.2f} / "
                 f"{ok[-1]['home_bytes_per_step'] / GiB:.2f} GiB") \
            if "to_gpu_bytes_per_step" in ok[-1] else ""
        table[v] = {**{k: ok[-1][k] for k in ok[-1] if k not in ("losses", "process_gpu_memory")},
                    "value": t, "s_per_step": secs, "x_link_limit": x_least,
                    "x_link_limit_with_step_on_gpu": x_on_gpu, "x_least_on_this_host": x_host,
                    "own_placement_limit": own_on_gpu,
                    "own_placement_limit_memory_shared": own_shared,
                    "least_on_this_host_s": own_host["seconds"] if own_host else None,
                    "same_losses": check["same"],
                    "link_limit_s": own_least["seconds"] if own_least else None,
                    "losses_max_abs_difference": check["max_abs_difference"],
                    "losses": ok[-1]["losses"], "process_gpu_memory": gpu,
                    "more_memory": v in MORE_MEMORY}
        fmt = ".0f" if scenario in TOKENS else ".3f"
        print(f"| {name} | {t['median']:{fmt}} ({t['min']:{fmt}}-{t['max']:{fmt}}) | "
              f"{'—' if x_least is None else f'{x_least:.2f}'} | "
              f"{'—' if x_on_gpu is None else f'{x_on_gpu:.2f}'} | "
              f"{'—' if x_host is None else f'{x_host:.2f}'} | "
              f"{method.describe_check(check, exact=exact(v))} | "
              f"{method.gpu_memory_cell(gpu)} | {moved} | "
              f"{ok[-1]['max_memory_allocated'] / GiB:.2f} GiB"
              + (f" + {ok[-1]['slot_bytes_peak'] / GiB:.2f} GiB |" if "slot_bytes_peak" in ok[-1]
                 else " |")
              + f" {method.gib_cell(ok[-1].get('host_peak_bytes'))} |")
    for mine, fsdp in UVM_STEPS.items():    # the same fused CPU AdamW, a group at a time
        ours, theirs = table.get(mine), table.get(fsdp)
        if ours and theirs:
            same = ours["losses"] == theirs["losses"]
            ours[f"same_losses_as_{fsdp}"] = same
            print(f"  {mine}: losses bit for bit as {fsdp}'s: {same}")
    for v, row in table.items():
        if row.get("bound_bytes"):    # the whole process against its bound
            method.report_bound(row, [r for r in runs[v] if r])
        if "optimizer" in row:   # the anchors' step, as it ran
            print(f"  {v}: optimizer {json.dumps(row['optimizer'])}")
        h = row.get("host_step_per_step")
        if h and h["units"]:     # what the host's step took, and what the step waited for it
            print(f"  {v}: the host stepped {row['host_stepped_bytes'] / GiB:.2f} GiB of weights "
                  f"({h['units']:.0f} units) a step in {h['step_seconds']:.3f} s of fused AdamW; "
                  f"optimizer.step() waited {h['wait_seconds']:.3f} s for it"
                  + (f"; the backward waited {h['copy_wait_seconds']:.3f} s for gradients' "
                     f"copies home" if "copy_wait_seconds" in h else "")
                  + settings_note(row.get("host_step_settings")))
    for v, rs in runs.items():
        for r in rs:
            if r and r.get("profile"):
                print(method.describe_profile(f"({scenario}) {v}", r["profile"]))
                break
    return table, lim


def main():
    ap = method.driver_args(argparse.ArgumentParser(), rounds=2, only="mlp,gpt2")
    ap.add_argument("--out", default=None,
                    help="where the JSON and plot go (default benchmarks/results; with "
                         "--from, required)")
    ap.add_argument("--from", dest="source", metavar="JSON",
                    help="report the runs of an offload_train.json again (the limits as "
                         "this file computes them now), running nothing; --only, --variants "
                         "and --rounds do not apply: the file's runs are reported")
    args = ap.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(run(args.scenario, args.variant)), flush=True)
        return
    machine = None
    if args.source:
        if args.out is None:
            ap.error("--from JSON needs --out DIR (the results folder is for runs)")
        with open(args.source) as f:
            source = json.load(f)
        runs = source.get("runs") or {}
        scenarios = [s for s in runs if runs[s]]
        unknown = [s for s in scenarios if s not in SCENARIOS]
        if not scenarios or unknown:
            ap.error(f"{args.source} holds no offload_train runs to report"
                     + (f" (unknown scenarios {unknown})" if unknown else ""))
        args.rounds = max(len(rs) for s in scenarios for rs in runs[s].values())
        machine = {**source.get("machine", {}), "reported_again_from": args.source,
                   "reported_again_on": time.strftime("%Y-%m-%d")}
    else:
        scenarios = method.chosen(PLAN, args.only, args.variants)
        runs = method.scenario_runs(os.path.abspath(__file__), PLAN, scenarios, args.rounds,
                                    timeout=480)
    compared, tables = {}, {}
    for s in scenarios:
        table, lim = report(s, runs[s], args.rounds)
        tables[s] = {"variants": table, "link_limit": lim["least"],
                     "link_limit_with_step_on_gpu": lim["on_gpu"], "least_on_this_host": lim["host"],
                     "least_on_this_host_memory_shared": lim["shared"],
                     "least_on_this_host_bf16_casts": lim["casts"],
                     "least_on_this_host_bf16_casts_memory_shared": lim["casts_shared"],
                     "least_on_this_host_rates_together": lim["together"],
                     "least_on_this_host_rates_together_bf16_casts": lim["together_casts"]}

        def metric(v):
            return [r["s_per_step"] if r else None for r in runs[s].get(v, [])]

        def against_fsdp2(v):     # FSDP2's offload, and in its fastest form where it ran
            compared[f"({s}) {v} / FSDP2 CPUOffloadPolicy, s per step"] = method.ratio(
                metric(v), metric("fsdp2_cpu_offload"))
            if runs[s].get("fsdp2_cpu_offload_bf16"):
                compared[f"({s}) {v} / FSDP2 CPUOffloadPolicy with MixedPrecisionPolicy, "
                         f"s per step"] = method.ratio(metric(v), metric("fsdp2_cpu_offload_bf16"))
        for v in [v for v in runs[s] if v.startswith("torch_uvm")]:
            ran = next((r for r in reversed(runs[s][v]) if r), None)
            if own_budget(s, v, ran) != budget(s):   # its own budget: the ratios to its own limit
                own = table.get(v, {}).get("link_limit_s")       # at the median rates
                if own:
                    compared[f"({s}) {v}, s per step / its link limit ({LEAST})"] = \
                        method.ratio(metric(v), [own] * args.rounds)
                own = table.get(v, {}).get("least_on_this_host_s")
                if own:
                    compared[f"({s}) {v}, s per step / its {HOST}"] = \
                        method.ratio(metric(v), [own] * args.rounds, target=1.5)
                against_fsdp2(v)
                continue
            if lim["least"]:
                compared[f"({s}) {v}, s per step / link limit ({LEAST})"] = method.ratio(
                    metric(v), lim["least_s"], target=1.5 if s == "llama" else None)
            if lim["host"]:
                compared[f"({s}) {v}, s per step / {HOST}"] = method.ratio(
                    metric(v), lim["host_s"], target=1.5 if s == "llama" else None)
            if lim["shared"]:
                compared[f"({s}) {v}, s per step / {SHARED} (an estimate)"] = method.ratio(
                    metric(v), lim["shared_s"])
            if lim["together"]:
                compared[f"({s}) {v}, s per step / {TOGETHER} (an estimate)"] = method.ratio(
                    metric(v), [lim["together"]["seconds"]] * args.rounds)
            own = table.get(v, {}).get("own_placement_limit")
            own_shared = table.get(v, {}).get("own_placement_limit_memory_shared")
            if method.variant_host_step(v) and own:      # at the median rates
                compared[f"({s}) {v}, s per step / its placement's limit (the host's step "
                         f"beside the link)"] = method.ratio(
                    metric(v), [own["seconds"]] * args.rounds, target=2.0)
                if own_shared:
                    compared[f"({s}) {v}, s per step / its placement's limit, the host's "
                             f"memory shared (an estimate)"] = method.ratio(
                        metric(v), [own_shared["seconds"]] * args.rounds)
            elif lim["on_gpu"]:
                compared[f"({s}) {v}, s per step / link limit {ON_GPU} "
                         f"(torch_uvm's placement)"] = method.ratio(
                    metric(v), lim["on_gpu_s"], target=2.0)
            against_fsdp2(v)
        for mine, fsdp in UVM_STEPS.items():     # the same arithmetic, stepped in backward
            if runs[s].get(mine) and runs[s].get(fsdp):
                compared[f"({s}) {mine} / {fsdp}, s per step"] = \
                    method.ratio(metric(mine), metric(fsdp))
        if s == "mlp":
            compared["(mlp) torch_uvm_in_backward, s per step (target 0.3)"] = method.ratio(
                metric("torch_uvm_in_backward"), [1.0] * args.rounds, target=0.3)
    method.print_comparisons(compared)
    out = args.out or os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(out, exist_ok=True)
    method.write(os.path.join(out, "offload_train.json"), compared, runs=runs, tables=tables,
                 **({"machine": machine} if machine else {}))
    plot(tables, os.path.join(out, "offload_train.png"))


def plot(tables, path):
    plt = method.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 4.5), squeeze=False)
    for ax, (s, t) in zip(axes[0], tables.items()):
        names = list(t["variants"])
        med, err = method.error_bars([t["variants"][n]["s_per_step"] for n in names])
        ax.bar(names, med, capsize=4, yerr=err)
        if t["link_limit"]:
            ax.axhline(t["link_limit"]["seconds"], color="k", ls="--",
                       label=f"link limit: {LEAST}")
        if t["link_limit_with_step_on_gpu"]:
            ax.axhline(t["link_limit_with_step_on_gpu"]["seconds"], color="gray", ls=":",
                       label=f"link limit {ON_GPU} (torch_uvm's placement)")
        if t["link_limit"] or t["link_limit_with_step_on_gpu"]:
            ax.legend(fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("s / step (log)")
        ax.tick_params(axis="x", rotation=25)
        for x, n in enumerate(names):   # the process's GPU memory, the driver's peak
            gpu = [g for g in t["variants"][n]["process_gpu_memory"] if g]
            if gpu:
                ax.annotate(f"{max(g['peak_bytes'] for g in gpu) / GiB:.1f} GiB", (x, med[x]),
                            ha="center", va="bottom", fontsize=7, xytext=(0, 3),
                            textcoords="offset points")
        ax.set_title(f"{s}: budget {budget(s) / GiB:.3g} GiB (labels: process GPU memory)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
