"""What an offload of a decoder-only transformer will take, before anything is
loaded or pinned: the process's GPU memory by part, the host memory, the
least GPU memory that works, and the fastest step the link allows.

    torch_uvm.estimate("path/to/config.json", task="full", budget="8GiB", batch=4, seq=1024)
    python -m torch_uvm estimate path/to/config.json --task full --budget 8GiB --batch 4 --seq 1024

It reads a Hugging Face ``config.json`` (Llama-style: gated MLP, grouped
key-value heads; GPT-2-style: ``n_embd``, ``n_layer``) and needs nothing
loaded. The parts, in bytes (docs/design.md, "The estimate", says where
each comes from):

* **slots**: the budget (the arena is drawn whole), or, if less, what keeps
  every weight resident: the weights, and in training a step's room beside them.
* **gradients in flight** (training): one unit's gradients being made and
  one unit's stepping or going home, outside the arena (PyTorch's allocator
  makes them; a backward stepping on the GPU goes on with at most that one
  step under way).
* **gradients copying home** (a full fine-tune with ``host_step``, under a
  budget): an eighth of the budget less the gradients in flight, beside
  the slots (under ``gpu_memory``, stream_optimizer holds them to those).
* **activations**: with activation checkpointing, each layer's input kept
  (``layers x batch x seq x hidden``, in the weights' dtype) and one layer's
  working set recomputed; without it, what the model's forward saves, read
  on the meta device (estimate_trace.decoder_trace: the model itself, or
  its config's made by transformers), else every layer's working set. A layer's
  working set is Korthikanti et al.'s (2022) ``seq x batch x hidden x (34 +
  5 heads seq / hidden)`` bytes at 2 bytes an element (the ``seq`` term
  only for eager attention), scaled to the activations' element size.
* **logits**: ``batch x seq x vocab`` in the activations' dtype, upcast to
  fp32 for the loss, and its gradient (training); the last token's alone
  (generation). A decoder trained without checkpointing peaks about its
  loss, and the weights' gradients are made as the loss's buffers are
  freed: its logits count only beyond the gradients in flight.
* **KV cache** (generation): ``2 x layers x batch x (seq + new_tokens) x
  kv_heads x head_dim``.
* **allocator's cache and workspaces**: what the runs measured beside
  their tensors (``CACHE_SHARE`` of the activations and logits, and
  ``RUNTIME_BYTES`` in training, ``FORWARD_RUNTIME_BYTES`` for a forward
  alone). Without checkpointing a decoder's saved activations
  live from forward to backward and leave no cache: the share is then of
  one layer's work and the logits.
* **margin** (under ``gpu_memory`` alone): one ``MARGIN_PARTS``-th of it,
  kept free for the estimate's error; ``least_gpu`` is the least
  ``gpu_memory`` that holds the rest with it.

Host memory: the pinned homes (the weights; for a full fine-tune also
AdamW's two states in fp32, and the gradients' unless they step in
backward, or, with ``host_step``, the host-stepped share of the streamed
weights' gradients), and ``HOST_RUNTIME_BYTES`` for the process's
libraries. What a training plan streams is the weights less what it keeps
resident: the budget less the least budget and the gradients' copies'
share of it (``streamed_in_training``).

The time is a floor, never above what a run can do: the least bytes any
placement moves over the link each step or token at the measured pinned
rate (generation: every weight outside the budget crosses once a token;
LoRA: the frozen weights outside it come for the forward and the backward;
a full fine-tune: ``least_full_crossing``, the least over the placements of
each weight and its two AdamW states, the link carrying both ways at once)."""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Dict, Optional

import torch

from .offload_state import STEPS_BEHIND, window_bytes, window_units
from .host_step import copies_share
from .activations import DEFAULT_WINDOW as ACTIVATIONS_WINDOW
from .estimate_trace import TraceFailed, decoder_of, decoder_trace, trace
from .sizes import card_bytes, parse_bytes

GiB = 1 << 30
# Measured beside the tensors, on H100s and H200s (benchmarks/results):
# the allocator's cache as a share of the activations' and logits' peak
# (the 3B full fine-tune: 1.65 GiB cached beside 3.14 GiB allocated; GPT-2
# 1.2B without checkpointing, whose saved activations stay: 1.29 GiB beside
# 12.5 GiB with its step on the GPU, 0.39 GiB with the host's, so there a
# share of one layer's work and the logits beyond the gradients), and
# what no books hold (cuBLAS's workspaces, the kernels loaded as they first
# run, segments' rounding): in training RUNTIME_BYTES, where the backward
# runs on autograd's own thread (a cuBLAS handle and workspace of its own)
# and loads the backward's and the optimizer's kernels; for a forward alone
# FORWARD_RUNTIME_BYTES, between what 2 GiB of bare fp16 Linears took
# (133-140 MiB) and what the 7B's generation left beside its parts (about
# 230 MiB).
CACHE_SHARE = 0.5
RUNTIME_BYTES = GiB // 4
FORWARD_RUNTIME_BYTES = 3 * GiB // 16
# Under gpu_memory, one MARGIN_PARTS-th of it is kept free for the estimate's
# error: a 7B's generation and full fine-tune under 24 GiB took 5.9% and 5.1%
# more than estimated (benchmarks/results/2026-11-28-h200, recipes-816cac6).
MARGIN_PARTS = 16
# The units whose gradients are alive in training: the one being made, and
# STEPS_BEHIND more: those whose step the backward goes on beside
# (offload_state.STEPS_BEHIND), or under gpu_memory a host step's copies home
# (gpu_memory.ProcessBound.copies_room holds them to as many).
IN_FLIGHT = STEPS_BEHIND + 1


def streamed_in_training(weights: int, budget: int, least: int, whole: int) -> int:
    """The weights a training plan streams under `budget`: none from `whole`
    on (the weights and a step's room: every unit resident); below it, what
    it keeps resident is the budget less the least one (the streaming
    window and a step's room) and the share the gradients copying home may
    take (host_step.copies_share)."""
    if budget >= whole:
        return 0
    resident = max(0, budget - least - int(copies_share() * budget))
    return max(0, min(weights, weights - resident))


def least_full_crossing(weights: int, budget: int, casts: bool) -> int:
    """The bytes a full fine-tune's step moves its heavier way at least, by
    any placement of `weights` and AdamW's two states (as many bytes again
    each) under `budget`, with the link carrying both ways at once: each
    weight byte is streamed (to the GPU in both passes, its gradient home,
    the host stepping it: 2 in, 1 out), resident alone (its gradient home,
    the stepped weight back: 1 and 1, a byte of budget) or resident with
    its states (3 bytes of budget, nothing crosses). Under 3 W that is
    2 W - B in below W, else (3 W - B) / 2 each way. Under autocast
    (`casts`) a placement may move the weights' bf16 casts instead, half
    as many bytes: with no budget every weight's cast still comes to the GPU
    in both passes (W in), and each byte of budget saves at most one byte
    in (a resident cast saves one for half a byte of budget), so W - B,
    what this gives then, is no more than that least."""
    if casts:
        return max(0, weights - budget)
    if budget < weights:
        return 2 * weights - budget
    return max(0, (3 * weights - budget) // 2)


def read_decoder(source, batch: int, seq: int, dtype: torch.dtype):
    """What a Hugging Face decoder (a model, or a config's, made on the
    meta device) saves for backward in training at `batch` x `seq`, in
    `dtype` (estimate_trace.decoder_trace); None, with a warning, where it
    cannot be read: the formula then counts a standard layer's, which
    undercounts models whose layers save more (GPT-2's save 2.5 times)."""
    try:
        model = decoder_of(source) if isinstance(source, dict) else source
        return decoder_trace(model, batch, seq, dtype)
    except TraceFailed as err:
        warnings.warn(f"torch_uvm: estimate could not read this model's forward on the meta "
                      f"device ({err}): its activations are a standard layer's by formula, "
                      f"which may undercount them. Checkpoint activations, or leave room",
                      stacklevel=3)
        return None


def least_bound(process: int) -> int:
    """The least gpu_memory whose margin leaves `process` bytes: the least
    B with B - B // MARGIN_PARTS >= process."""
    if process <= 0:
        return 0
    return MARGIN_PARTS * (process - 1) // (MARGIN_PARTS - 1) + 1
# The host memory of the process beside the homes: Python, torch and CUDA's
# libraries (a 7B generation's peak: 14.12 GiB beside 12.55 GiB of homes).
HOST_RUNTIME_BYTES = 3 * GiB // 2
TASKS = ("generate", "lora", "full")
WORDS = {"generate": "generation", "lora": "LoRA fine-tune", "full": "full fine-tune"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


# Config keys of models whose weights a dense decoder's formulas would
# miscount: experts (each layer holds several MLPs) and an encoder beside
# the decoder.
UNREAD_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def refuse_unread(config: dict) -> None:
    """Refuses a config whose weights the dense decoder-only formulas would
    miscount, naming the way that measures them: the model itself, on the
    meta device."""
    experts = [k for k in UNREAD_KEYS if (config.get(k) or 0) > 1]
    if experts or config.get("is_encoder_decoder"):
        what = f"experts ({experts[0]}={config[experts[0]]})" if experts else \
            "an encoder beside its decoder (is_encoder_decoder)"
        raise ValueError(
            f"torch_uvm: estimate's formulas count a dense decoder-only model's weights, and "
            f"this config has {what}: pass the model itself instead, built on the meta device "
            f"(with torch.device('meta'): AutoModelForCausalLM.from_config(config)), whose "
            f"units are then measured")


@dataclasses.dataclass
class Shape:
    """What the estimate reads of a config."""
    kind: str             # "llama" or "gpt2"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    positions: int = 0    # GPT-2's learned position embeddings

    @classmethod
    def from_config(cls, config: dict) -> "Shape":
        get = config.get
        hidden = get("hidden_size") or get("n_embd")
        layers = get("num_hidden_layers") or get("n_layer")
        heads = get("num_attention_heads") or get("n_head")
        vocab = get("vocab_size")
        missing = [n for n, v in (("hidden_size", hidden), ("num_hidden_layers", layers),
                                  ("num_attention_heads", heads), ("vocab_size", vocab)) if not v]
        if missing:
            raise ValueError(f"torch_uvm: estimate reads decoder-only transformer configs "
                             f"(Llama-style or GPT-2-style); this one lacks {missing}")
        gpt2 = get("model_type") == "gpt2" or "n_embd" in config
        return cls(kind="gpt2" if gpt2 else "llama", hidden=hidden, layers=layers, heads=heads,
                   kv_heads=get("num_key_value_heads") or heads,
                   intermediate=get("intermediate_size") or get("n_inner") or 4 * hidden,
                   vocab=vocab, tied=get("tie_word_embeddings", gpt2),
                   positions=(get("n_positions") or 0) if gpt2 else 0)

    def layer_pieces(self) -> Dict[str, int]:
        """Parameters (elements) of a decoder layer's submodules that have
        tensors of their own (each kind once)."""
        h, i = self.hidden, self.intermediate
        kv = self.kv_heads * (h // self.heads)
        if self.kind == "gpt2":
            return {"attn.c_attn": 3 * h * h + 3 * h, "attn.c_proj": h * h + h,
                    "mlp.c_fc": h * i + i, "mlp.c_proj": i * h + h, "ln": 2 * h}
        return {"q_proj": h * h, "o_proj": h * h, "k_proj": h * kv, "v_proj": h * kv,
                "mlp.proj": h * i, "norm": h}

    def per_layer(self) -> int:
        """A decoder layer's parameters (elements)."""
        h, i = self.hidden, self.intermediate
        if self.kind == "gpt2":       # its pieces, and its second norm
            return sum(self.layer_pieces().values()) + 2 * h
        kv = self.kv_heads * (h // self.heads)
        return 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h

    def unit_params(self, units: str) -> Dict[str, int]:
        """Parameters (elements) of each kind of unit: by default every
        submodule with tensors of its own, or ``units="layers"``: each
        decoder layer whole."""
        h = self.hidden
        out = {"embed": self.vocab * h + self.positions * h,
               "final_norm": h * (2 if self.kind == "gpt2" else 1)}
        if not self.tied:
            out["head"] = self.vocab * h
        if units == "layers":
            out["layer"] = self.per_layer()
        else:
            out.update(self.layer_pieces())
        return out

    def params(self) -> int:
        u = self.unit_params("layers")
        return u["embed"] + u["final_norm"] + u.get("head", 0) + self.layers * u["layer"]


def size_text(nbytes: int) -> str:
    """"1.50 GiB", or "12.0 MiB" below a GiB."""
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / 2**20:.1f} MiB"


@dataclasses.dataclass
class Estimate:
    task: str
    budget: int
    gpu: Dict[str, int]               # the process's GPU memory, by part
    host_pinned: int
    host: int                         # the process's host memory: the homes and the runtime
    least_budget: int
    least_gpu: int                    # the least gpu_memory that holds it (margin and all)
    weights: int
    link_gbps: Optional[float]        # the pinned rate measured now (None: no GPU)
    floor_s: Optional[float]          # the least seconds a step (a token) takes at it
    per: str                          # "step" or "token"
    tokens: int                       # tokens a step (a token: the batch)
    activations_home: bool = False    # saved activations go home (offload_activations)
    batch: int = 1
    seq: int = 1

    @property
    def gpu_total(self) -> int:
        return sum(self.gpu.values())

    def table(self) -> str:
        g = size_text
        lines = [f"torch_uvm estimate: {self.task}, batch {self.batch} x {self.seq}, budget "
                 f"{g(self.budget)}, weights {g(self.weights)}"
                 f"{', saved activations home' if self.activations_home else ''}",
                 f"  process GPU memory     {g(self.gpu_total)}"]
        lines += [f"    {k:<20} {g(v)}" for k, v in self.gpu.items()]
        lines += [f"  host memory            {g(self.host)} ({g(self.host_pinned)} pinned)",
                  f"  least budget           {g(self.least_budget)} (gpu_memory {g(self.least_gpu)})"]
        if self.link_gbps is None:
            lines.append("  link                   not measured: no GPU here (the time floor "
                         "needs the pinned rate: pass --link-gbps, or link_gbps=)")
        elif not self.floor_s:
            lines.append(f"  link                   {self.link_gbps:.1f} GB/s pinned: it bounds "
                         "nothing (every weight stays on the GPU)")
        else:
            lines.append(f"  link                   {self.link_gbps:.1f} GB/s pinned: at most "
                         f"{self.tokens / self.floor_s:.0f} tokens/s ({self.floor_s:.3f} s a "
                         f"{self.per} at least)")
        return "\n".join(lines)


def measure_link_gbps(nbytes: int = 256 << 20) -> Optional[float]:
    """The pinned host-to-GPU rate now (best of 3), or None without a GPU."""
    import time

    import torch
    if not torch.cuda.is_available():
        return None
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def module_units(module, units: str):
    """The bytes of each unit offload() would make of `module` (its own
    tensors; tied ones once): each submodule, or with ``units="layers"``
    the classes its ``_no_split_modules`` names. Any other `units` is
    offload()'s own (classes, names, a function)."""
    return [nbytes for nbytes, _ in unit_sizes(module, units)]


def unit_sizes(module, units: str):
    """(bytes, bytes of the parameters that require grad) of each unit, as
    module_units makes them, in one walk of the module."""
    from .offload_units import make_units, offload_plan, unit_roots
    if units == "layers":
        names = getattr(module, "_no_split_modules", None)
        if not names:
            raise ValueError("torch_uvm: estimate's units='layers' reads the module's "
                             "_no_split_modules, and this module has none")
        matched = list(names)
    else:
        matched = None if units == "submodules" else units
    plan = offload_plan(module)
    shared = {id(t): t for _, _, own, _ in plan for _, t, _ in own}
    made = make_units(plan, unit_roots(module, matched), shared)
    for u in made:     # (offload fills them in as it installs; here, as it would)
        u.trainable = [t for t in u.targets if isinstance(t, torch.nn.Parameter) and t.requires_grad]
    return [(u.nbytes, u.trainable_bytes) for u in made]


def estimate(config, task: str = "generate", budget=None, gpu_memory=None,
             batch: Optional[int] = None, seq: Optional[int] = None,
             new_tokens: int = 32, dtype: Optional[str] = None, units: str = "submodules",
             ahead: int = 1, checkpointing: bool = True, eager_attention: Optional[bool] = None,
             lora_rank: int = 16, autocast: bool = True, step_in_backward: bool = True,
             link_gbps: Optional[float] = "measure", taken: Optional[int] = None,
             activations_home=False, host_step: float = 0.0, inputs=None) -> Estimate:
    """The estimate of an offload of the model `config` describes (a
    ``config.json``, its folder, or its dict; or a Hugging Face model
    itself, on the meta device say, whose units are then measured as
    offload() makes them); see the module's doc.
    `task`: "generate", "lora" (a frozen base, adapters of `lora_rank` on
    every projection, checkpointing) or "full" (fp32 weights and AdamW,
    under bf16 autocast unless `autocast` is False; `step_in_backward`:
    its gradients never go home, so they have no homes). `budget`: a
    size (sizes.py); default the least that works, or, given `gpu_memory`
    (the most GPU memory the whole process may take), the largest budget
    within it (refused, naming the least that fits and what takes it,
    when even the least budget does not). `dtype`: the weights' (default:
    fp32 for "full", else the config's ``torch_dtype``, else bf16).
    `gpu_memory` is a size, a float (that fraction of the card's memory) or
    "auto" (sizes.card_bytes). `taken`: the bytes the process holds on the
    GPU before the offload (its CUDA context, say: offload's gpu_memory
    measures them), a part of its own. `activations_home`: saved
    activations go to pinned host memory (offload_activations), so at most
    two of its windows of them stay; "auto": only when gpu_memory cannot
    hold them otherwise. `host_step` (a full fine-tune stepping in
    backward): the share of the streamed weights stepped on the host, whose
    gradients then go home (stream_optimizer's host_step). `inputs` (a
    module's estimate): the forward's arguments, tensors of a step's shapes
    on any device; the activations are then read from one forward on the
    meta device (estimate_trace.py), not from a config's formulas: the way
    for a module that is no Hugging Face decoder. `eager_attention`: the attention keeps its
    probabilities for backward (Hugging Face's "eager"); default: as a
    model's ``config._attn_implementation`` says, False for a config file
    (which does not record it)."""
    if task not in TASKS:
        raise ValueError(f"torch_uvm: estimate's task is one of {TASKS}, got {task!r}")
    if isinstance(host_step, bool) or not isinstance(host_step, (int, float)) or \
            not 0 <= host_step <= 1:
        raise ValueError(f"torch_uvm: estimate's host_step is a share from 0 to 1 of the "
                         f"streamed weights stepped on the host, got {host_step!r}")
    if units not in ("submodules", "layers") and not isinstance(config, torch.nn.Module):
        raise ValueError(f"torch_uvm: estimate's units is 'submodules' or 'layers' (of a module: "
                         f"anything offload's units takes), got {units!r}")
    if inputs is not None and (batch is not None or seq is not None):
        raise ValueError("torch_uvm: estimate's inputs give the step's shapes; pass batch= and "
                         "seq= for a config, not with inputs")
    batch = 1 if batch is None else batch
    seq = 512 if seq is None else seq
    for name, v in (("batch", batch), ("seq", seq), ("ahead", ahead)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"torch_uvm: estimate's {name} must be a positive int, got {v!r}")
    module = config if isinstance(config, torch.nn.Module) else None
    training = task != "generate"
    traced = shape = decoder = reads = None   # reads: a decoder whose forward is read
    if inputs is not None and module is None:
        raise ValueError("torch_uvm: estimate's inputs run a module's forward; a config's "
                         "shapes come from batch= and seq=")
    if module is not None:     # (on the meta device, say: nothing of it is read but its shapes)
        hf = getattr(module, "config", None)
        if inputs is not None and hasattr(hf, "to_dict"):
            raise ValueError("torch_uvm: estimate's inputs are for a module with no Hugging Face "
                             "config; a Hugging Face model is estimated from its config (its KV "
                             "cache, checkpointing and attention): pass batch= and seq= instead")
        if inputs is not None:
            if training and not any(p.requires_grad for p in module.parameters()):
                raise ValueError(f"torch_uvm: estimate's task {task!r} trains, and none of this "
                                 f"module's parameters requires grad: set requires_grad on what "
                                 f"trains (the adapters, say), or task='generate'")
            traced = trace(module, inputs, training)
            batch, seq = traced.batch, traced.seq
        elif not hasattr(hf, "to_dict"):
            raise ValueError("torch_uvm: estimate of a module that is no Hugging Face model (it "
                             "has no module.config) reads its activations from one forward on "
                             "the meta device: pass inputs=, the forward's arguments (tensors "
                             "of a step's shapes)")
        else:
            config = hf.to_dict()
            if eager_attention is None:
                eager_attention = getattr(hf, "_attn_implementation", None) == "eager"
            if training and not checkpointing:   # its own code's saved tensors, not a formula's
                reads = module
        if dtype is None:
            first = next((p for p in module.parameters() if p.is_floating_point()), None)
            dtype = str(first.dtype).replace("torch.", "") if first is not None else None
    if traced is None:
        if not isinstance(config, dict):     # a config.json, or its folder: read once
            path = os.fspath(config)
            path = os.path.join(path, "config.json") if os.path.isdir(path) else path
            with open(path) as f:
                config = json.load(f)
        shape = Shape.from_config(config)
        if module is None:
            refuse_unread(config)
            if training and not checkpointing:   # (a config: its model made on the meta device)
                reads = config
    if dtype is None:
        dtype = "float32" if task == "full" or traced else \
            config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"torch_uvm: estimate's dtype is one of {sorted(DTYPE_BYTES)}, got "
                         f"{dtype!r}")
    e = DTYPE_BYTES[dtype]
    act = 2 if task == "full" and autocast else e     # bf16 autocast over fp32 weights
    if reads is not None:         # (its forward traced in the activations' dtype)
        decoder = read_decoder(reads, batch, seq,
                               getattr(torch, dtype) if act == e else torch.bfloat16)
    if module is not None:     # its units as offload() would make them, measured
        measured = unit_sizes(module, units)
        sizes = [nbytes for nbytes, _ in measured]
        weights, largest = sum(sizes), max(sizes)
        trainable = [t for _, t in measured] if training else [0]
    else:
        weights = shape.params() * e
        largest = max(shape.unit_params(units).values()) * e
        trainable = None
    adapters = 0
    if task == "lora" and trainable is None:
        # PEFT's adapters on a layer's seven projections, fp32: A (in x rank)
        # and B (rank x out) each; they are among the offloaded weights
        h, i = shape.hidden, shape.intermediate
        kv = shape.kv_heads * (h // shape.heads)
        per_layer = lora_rank * (9 * h + 2 * kv + 3 * i) * 4   # q, o: h+h; k, v: h+kv; MLP: h+i
        adapters = shape.layers * per_layer
        weights += adapters
    if task == "full":
        largest_trainable = largest if trainable is None else max(trainable)
    elif task == "lora" and trainable is not None:
        largest_trainable = max(trainable)
    elif task == "lora" and units == "submodules":   # the largest adapter: each A and B a unit
        largest_trainable = lora_rank * max(shape.hidden, shape.intermediate) * 4
    elif task == "lora":                             # a layer's adapters
        largest_trainable = per_layer
    else:
        largest_trainable = 0
    least = window_bytes("prefetch", training, ahead, largest, largest_trainable)
    # The budget that keeps every weight resident: the weights and, training, a
    # step's room beside them, as the offload's plan counts it (its window with
    # the copies home: offload_state.window_units, core/resident_plan.h). A
    # budget of the weights alone streams a window of them every step. (A tied
    # weight counts in each unit that holds it: then a little more than needed.)
    whole = weights + window_units("prefetch", training, ahead)[1] * largest_trainable
    chosen = parse_bytes(budget, "the budget")
    bound = card_bytes(gpu_memory, "gpu_memory")
    if chosen is not None and bound is not None:
        raise ValueError("torch_uvm: give estimate a budget or gpu_memory, not both: "
                         "gpu_memory chooses the budget")
    if activations_home not in (False, True, "auto"):
        raise ValueError(f"torch_uvm: estimate's activations_home is False, True or 'auto', "
                         f"got {activations_home!r}")
    if taken is not None and (isinstance(taken, bool) or not isinstance(taken, int) or taken < 0):
        raise ValueError(f"torch_uvm: estimate's taken is bytes (an int, 0 or more), got {taken!r}")

    def gpu_parts(b: int, home: bool, margin: int = 0) -> Dict[str, int]:
        parts = {} if taken is None else {"held before the offload": taken}
        parts["slots"] = min(b, whole)
        # (what comes and goes: without checkpointing, a decoder's saved
        # activations live from forward to backward and leave no cache)
        working = traced_parts(parts, home) if traced is not None else formula_parts(parts, home)
        if task == "full" and step_in_backward and host_step and bound is None:
            # the host-stepped gradients on their way home, beside the slots (under
            # gpu_memory, stream_optimizer holds them to the gradients in flight)
            copying = min(int(copies_share() * b), streamed_in_training(weights, b, least, whole))
            parts["gradients copying home"] = max(0, copying - parts["gradients in flight"])
        parts["allocator's cache"] = int(CACHE_SHARE * (working + parts["logits"]))
        parts["workspaces"] = RUNTIME_BYTES if training else FORWARD_RUNTIME_BYTES
        if margin:
            parts["margin"] = margin
        return parts

    def traced_parts(parts: Dict[str, int], home: bool) -> int:
        # (the trace runs in the weights' dtype; under autocast, the casts' size)
        saved, work = (int(traced.saved * act / e), int(traced.largest * act / e))
        if training:
            parts["gradients in flight"] = IN_FLIGHT * largest_trainable
            if home:     # offload_activations: two windows on their way
                saved = min(saved, 2 * ACTIVATIONS_WINDOW)
            parts["activations"] = saved + work
            parts["logits"] = 2 * traced.output        # the output and its gradient
        else:
            parts["activations"] = work
            parts["logits"] = traced.output
        return parts["activations"]

    def formula_parts(parts: Dict[str, int], home: bool) -> int:
        h, L, V = shape.hidden, shape.layers, shape.vocab
        tokens = batch * seq
        layer = tokens * h * (34 + (5 * shape.heads * seq / h if eager_attention else 0)) * act / 2
        if training:
            parts["gradients in flight"] = IN_FLIGHT * largest_trainable
            saved = L * tokens * h * e if checkpointing else (L - 1) * layer
            if decoder is not None:     # (read in the activations' dtype)
                saved = decoder.saved
            if home:     # offload_activations: two windows on their way, a layer working
                saved = min(saved, 2 * ACTIVATIONS_WINDOW)
            parts["activations"] = int(saved + layer)
            parts["logits"] = tokens * V * (act + 4 + 4)
            if decoder is not None:
                # The peak is about the loss; the weights' gradients are made as its
                # buffers are freed: the logits count beyond the gradients in flight.
                # (GPT-2 1.2B allocated 12.50 GiB at its peak whether its budget was 4 or
                # 2.28 GiB, against 11.92 of activations and 1.15 of logits traced.)
                parts["logits"] = max(0, parts["logits"] - parts["gradients in flight"])
                # (read, the saved activations stay from forward to backward: no cache;
                # checkpointed, each layer's work comes and goes again)
                return int(layer)
        else:
            parts["activations"] = int(layer)
            parts["logits"] = batch * V * (act + 4)
            kv = shape.kv_heads * (h // shape.heads)
            parts["KV cache"] = 2 * L * batch * (seq + new_tokens) * kv * e
        return parts["activations"]

    home = activations_home is True and training
    margin = 0 if bound is None else bound // MARGIN_PARTS
    if bound is not None:
        beside = sum(gpu_parts(0, home).values())          # all but the slots and the margin
        if beside + least + margin > bound and activations_home == "auto" and training:
            home = True                                    # what sending them home leaves
            beside = sum(gpu_parts(0, home).values())
        if beside + least + margin > bound:
            need = least_bound(beside + least)
            taken_by = ", ".join(f"{k} {size_text(v)}" for k, v in
                                 gpu_parts(least, home, need // MARGIN_PARTS).items())
            lower = "give smaller inputs" if traced else "lower batch or seq"
            checkpoint = training and not checkpointing and not traced
            raise ValueError(
                f"torch_uvm: {size_text(bound)} of GPU memory cannot hold this {WORDS[task]} "
                f"at batch {batch} x {seq} tokens: the least that works is "
                f"{size_text(need)} ({taken_by}). Raise gpu_memory, or {lower}"
                f"{', or checkpoint activations' if checkpoint else ''}"
                f"{', or send activations home' if training and activations_home is False else ''}")
        chosen = min(bound - beside - margin, whole)
    elif chosen is None:
        chosen = least
    gpu = gpu_parts(chosen, home, margin)
    if task == "full":     # weights, two states, and gradients unless they step in backward
        host = weights * (3 if step_in_backward else 4)
        if step_in_backward and host_step:      # the host-stepped ones' gradients go home
            host += int(host_step * streamed_in_training(weights, chosen, least, whole))
    elif task == "lora":     # the adapters are among the weights: their gradients
        host = weights + 3 * (sum(trainable) if trainable is not None else adapters)  # and states
    else:
        host = weights
    rate = measure_link_gbps() if link_gbps == "measure" else link_gbps
    streamed = max(0, weights - chosen)
    if not training:
        per, tokens, crossing = "token", batch, streamed
    elif task == "lora":   # the frozen base comes for the forward and for the backward
        per, tokens, crossing = "step", batch * seq, 2 * streamed
    else:
        per, tokens = "step", batch * seq
        crossing = least_full_crossing(weights, chosen, casts=autocast)
    floor = crossing / (rate * 1e9) if rate else None
    return Estimate(task=task, budget=chosen, gpu=gpu, host_pinned=host,
                    host=host + HOST_RUNTIME_BYTES, least_budget=least,
                    least_gpu=least_bound(sum(gpu_parts(least, home).values())), weights=weights,
                    link_gbps=rate, floor_s=floor, per=per, tokens=tokens,
                    activations_home=home, batch=batch, seq=seq)
