"""What a module's forward keeps for its backward, read by running it on the
meta device: estimate()'s activations for a module that is no Hugging Face
decoder (an MLP, a vision model), whose activations no formula knows, and
for a decoder trained without checkpointing, whose layers may save more
than the formula's standard one (decoder_trace).

The forward runs once through ``torch.func.functional_call`` with every
parameter and buffer replaced by a meta tensor of its shape, on meta
inputs of the shapes given: nothing is computed, copied or allocated, and
the module itself is not touched (on the CPU, on the meta device, anywhere).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import inspect
import threading
import types
from typing import Dict, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map


@dataclasses.dataclass
class Traced:
    saved: int       # bytes the forward saves for backward, the module's own tensors left out
    largest: int     # the largest tensor one operation made (a layer's work at once)
    output: int      # the bytes of the forward's output
    batch: int       # the first input's leading size
    seq: int         # its second, for token ids or (batch, seq, features); else 1


class _Largest(TorchDispatchMode):
    """The largest tensor any operation but a view returns (none while
    `skip()` says so: inside an attention a fused kernel runs)."""

    def __init__(self, skip=lambda: False):
        super().__init__()
        self.nbytes, self.skip = 0, skip

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or self.skip():   # (a view makes no memory: a weight transposed, say)
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.nbytes = max(self.nbytes, t.nbytes)
        return out


def _meta(t: torch.Tensor) -> torch.Tensor:
    m = torch.empty_like(t, device="meta")
    return torch.nn.Parameter(m, requires_grad=t.requires_grad) \
        if isinstance(t, torch.nn.Parameter) else m


@dataclasses.dataclass
class Call:
    """A forward's arguments as one call passed them: inputs that are both
    positional and keyword (the check of a later forward passes these)."""
    args: tuple
    kwargs: dict


class TraceFailed(ValueError):
    """The forward raised on the meta device (ValueError, naming why)."""


def call_of(inputs) -> tuple:
    """`inputs` (a tensor, a tuple of positional arguments, a dict of
    keyword ones, or a Call) as a call's (args, kwargs)."""
    if isinstance(inputs, Call):
        return tuple(inputs.args), dict(inputs.kwargs)
    if isinstance(inputs, dict):
        return (), dict(inputs)
    return (inputs if isinstance(inputs, tuple) else (inputs,)), {}


def meta_inputs(inputs):
    """`inputs` with each tensor a meta tensor of its shape and dtype (no
    memory held, nothing read)."""
    return tree_map(lambda t: torch.empty_like(t, device="meta")
                    if isinstance(t, torch.Tensor) else t, inputs)


# Attributes a twin leaves out: torch_uvm's own marks (offload's, which
# holds its handle and so every home), and accelerate's hook and the
# forward it wraps (its weights map holds the offloaded weights).
LEFT_OUT = ("_torch_uvm", "_hf_hook", "_old_forward")
# PyTorch's dicts of a module's hooks (_forward_hooks, _forward_pre_hooks_with_kwargs, ...)
HOOK_DICTS = ("hooks", "hooks_with_kwargs", "hooks_always_called")


def meta_twin(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module`'s structure whose parameters and buffers (and any
    tensor it holds as an attribute) are meta tensors of their shapes,
    shared where the module shares them, with no hooks and none of
    LEFT_OUT: what a trace runs, so that the module itself, offloaded and
    hooked by then, runs nothing and nothing of it is copied. A method
    bound to one of its modules (a forward set on the instance) is bound
    to that module's twin; its lists, sets and dicts are copied a level
    deep; its other attributes (a config, say) are the module's own."""
    tensors: Dict[int, torch.Tensor] = {}
    made: Dict[int, torch.nn.Module] = {}
    bound: List[Tuple[torch.nn.Module, str, types.MethodType]] = []

    def meta(t):
        if id(t) not in tensors:
            tensors[id(t)] = _meta(t)
        return tensors[id(t)]

    def twin(m: torch.nn.Module) -> torch.nn.Module:
        if id(m) in made:                 # (a submodule used twice stays one)
            return made[id(m)]
        t = m.__class__.__new__(m.__class__)
        made[id(m)] = t
        own = {}
        accelerate = "_hf_hook" in vars(m)
        for k, v in vars(m).items():
            if k.startswith(LEFT_OUT) or (k == "forward" and accelerate):
                continue
            if k.startswith("_") and k.endswith(HOOK_DICTS) and isinstance(v, dict):
                v = collections.OrderedDict()
            elif k in ("_parameters", "_buffers"):
                v = {n: None if x is None else meta(x) for n, x in v.items()}
            elif k == "_modules":
                v = {n: None if c is None else twin(c) for n, c in v.items()}
            elif isinstance(v, torch.Tensor):
                v = meta(v)
            elif isinstance(v, types.MethodType) and isinstance(v.__self__, torch.nn.Module):
                bound.append((t, k, v))   # (bound once every twin is made)
                continue
            elif isinstance(v, (list, set, dict)):
                v = copy.copy(v)
            own[k] = v
        t.__dict__.update(own)
        return t
    root = twin(module)
    for t, k, method in bound:
        t.__dict__[k] = types.MethodType(method.__func__, twin(method.__self__))
    return root


class _Attention:
    """scaled_dot_product_attention while traces run: one wrapper, put in
    place by the first trace that enters and taken away by the last that
    leaves (in any thread), which hands each call to the trace running in
    its thread, if any."""
    lock = threading.Lock()
    original = None
    tracing: Dict[int, List["_FusedAttention"]] = {}     # thread: its traces, innermost last

    @classmethod
    def enter(cls, trace: "_FusedAttention") -> None:
        with cls.lock:
            if not cls.tracing:
                cls.original = torch.nn.functional.scaled_dot_product_attention
                torch.nn.functional.scaled_dot_product_attention = cls.attention
            cls.tracing.setdefault(threading.get_ident(), []).append(trace)

    @classmethod
    def leave(cls, trace: "_FusedAttention") -> None:
        with cls.lock:
            mine = cls.tracing[threading.get_ident()]
            mine.remove(trace)
            if not mine:
                del cls.tracing[threading.get_ident()]
            if not cls.tracing:
                torch.nn.functional.scaled_dot_product_attention = cls.original

    @staticmethod
    def attention(query, key, value, attn_mask=None, *args, **kwargs):
        mine = _Attention.tracing.get(threading.get_ident())
        if not mine:
            return _Attention.original(query, key, value, attn_mask, *args, **kwargs)
        return mine[-1].attention(query, key, value, attn_mask, *args, **kwargs)


class _FusedAttention:
    """While a trace runs: scaled_dot_product_attention counted as the
    fused kernels a GPU runs save it (its query, key, value, mask and
    output, where its output needs a gradient), not as the meta device's
    math, which saves the attention's probabilities (batch x heads x seq
    x seq)."""

    def __init__(self, keep):
        self.keep, self.depth = keep, 0

    def inside(self) -> bool:
        return self.depth > 0

    def attention(self, query, key, value, attn_mask, *args, **kwargs):
        self.depth += 1
        try:
            out = _Attention.original(query, key, value, attn_mask, *args, **kwargs)
        finally:
            self.depth -= 1
        if out.requires_grad:
            for t in (query, key, value, attn_mask, out):
                if isinstance(t, torch.Tensor):
                    self.keep(t)
        return out

    def __enter__(self):
        _Attention.enter(self)
        return self

    def __exit__(self, *_):
        _Attention.leave(self)


def decoder_of(config: dict) -> torch.nn.Module:
    """The Hugging Face causal LM a config describes, made on the meta
    device by transformers' own classes (its code, so its activations);
    TraceFailed, naming why, where transformers is absent or cannot."""
    try:
        import transformers
    except ImportError:
        raise TraceFailed("transformers is not installed") from None
    try:
        rest = {k: v for k, v in config.items() if k != "model_type"}
        made = transformers.AutoConfig.for_model(config["model_type"], **rest)
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(made)
    except Exception as err:      # (an unknown model_type, or a config it refuses)
        raise TraceFailed(f"transformers could not make it ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})") from None


def decoder_trace(module: torch.nn.Module, batch: int, seq: int, dtype: torch.dtype) -> Traced:
    """What a Hugging Face decoder's training forward on `batch` x `seq`
    token ids saves for backward, its twin's floating tensors in `dtype`
    (the activations'), read on the meta device (trace); TraceFailed,
    naming why, where it cannot be copied or its forward cannot run there."""
    try:
        twin = meta_twin(module)
    except Exception as err:      # (something in it that cannot be copied)
        raise TraceFailed(f"it could not be copied ({type(err).__name__})") from None
    match_modes(twin, module)
    twin.train()
    twin.to(dtype)
    try:
        return trace(twin, {"input_ids": torch.zeros(batch, seq, dtype=torch.long)}, True)
    except ValueError as err:     # (TraceFailed, or a forward that takes no input_ids)
        raise TraceFailed(f"its forward raised there, {getattr(err, 'cause', err)}") from None


def match_modes(twin: torch.nn.Module, module: torch.nn.Module) -> None:
    """The twin in the module's train() or eval() now, submodule by
    submodule, its parameters requiring grad as the module's do."""
    for a, b in zip(twin.modules(), module.modules()):
        a.training = b.training
    for a, b in zip(twin.parameters(), module.parameters()):
        a.requires_grad_(b.requires_grad)


def trace(module: torch.nn.Module, inputs, training: bool) -> Traced:
    """`inputs`: a tensor, a tuple of the forward's positional arguments, a
    dict of its keyword arguments, or a Call of both (tensors of the shapes and dtypes a step
    feeds it, on any device: only those are read). ValueError, naming the
    cause, for arguments the forward does not take, or a forward that cannot
    run on the meta device."""
    args, kwargs = call_of(inputs)
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise ValueError(f"torch_uvm: estimate's inputs are the forward's arguments: a tensor, "
                         f"a tuple or a dict with tensors, got {type(inputs).__name__}")
    try:
        inspect.signature(module.forward).bind(*args, **kwargs)
    except TypeError as err:
        raise ValueError(f"torch_uvm: estimate's inputs must be arguments "
                         f"{type(module).__name__}.forward takes ({err})") from None
    args, kwargs = meta_inputs((args, kwargs))
    own = {name: _meta(t) for name, t in
           list(module.named_parameters()) + list(module.named_buffers())}
    ids = {id(t) for t in own.values()}
    saved = {}

    def pack(t):
        base = t if t._base is None else t._base   # (a view keeps its base: counted once)
        if id(base) not in ids:                    # (a weight saved transposed is its own)
            saved[id(base)] = base
        return None
    fused = _FusedAttention(pack)
    largest = _Largest(fused.inside)

    def pack_outside_attention(t):
        return None if fused.inside() else pack(t)
    try:
        with torch.set_grad_enabled(training), fused, largest, \
                torch.autograd.graph.saved_tensors_hooks(pack_outside_attention, lambda _: None):
            out = torch.func.functional_call(module, own, args, kwargs)
    except Exception as err:     # (whatever the forward raises on the meta device)
        cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        failed = TraceFailed(f"torch_uvm: estimate could not run the module's forward on the "
                             f"meta device to read its activations ({cause}); give the offload "
                             f"a budget= instead, from a measured run")
        failed.cause = cause
        raise failed from None
    output = sum(t.nbytes for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    first = tensors[0]
    sequence = first.dim() >= 3 or (first.dim() == 2 and not first.is_floating_point())
    return Traced(saved=sum(t.nbytes for t in saved.values()), largest=largest.nbytes,
                  output=output, batch=first.shape[0] if first.dim() else 1,
                  seq=first.shape[1] if sequence else 1)
