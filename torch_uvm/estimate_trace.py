"""What a module's forward keeps for its backward, read by running it on the
meta device: estimate()'s activations for a module that is no Hugging Face
decoder (an MLP, a vision model), whose activations no formula knows.

The forward runs once through ``torch.func.functional_call`` with every
parameter and buffer replaced by a meta tensor of its shape, on meta
inputs of the shapes given: nothing is computed, copied or allocated, and
the module itself is not touched (on the CPU, on the meta device, anywhere).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Optional

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
    dtype_bytes: int = 4   # the element size of the module's first floating parameter


class _Largest(TorchDispatchMode):
    """The largest tensor any operation but a view returns."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:        # (a view makes no memory: a weight transposed, say)
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


# torch_uvm's own attributes on a module (offload's mark, which holds its
# handle and so every home) begin so: a twin copies none of them.
MARKS = "_torch_uvm"


def meta_twin(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` whose parameters and buffers are meta tensors of
    their shapes and which has no hooks (nothing else of it copied but its
    structure): what a trace runs, so that the module itself, offloaded
    and hooked by then, runs nothing. TypeError or the like where it
    cannot be copied."""
    memo = {}
    for t in list(module.parameters()) + list(module.buffers()):
        memo[id(t)] = _meta(t)
    for m in module.modules():   # (its hooks' dicts stand for empty ones: an offload's
        for name, value in vars(m).items():   # hooks are neither copied nor run)
            if "hooks" in name and isinstance(value, dict):
                memo[id(value)] = type(value)()
            elif name.startswith(MARKS):    # (an offload's handle: its homes stay uncopied)
                memo[id(value)] = None
    return copy.deepcopy(module, memo)


def decoder_of(config: dict) -> Optional[torch.nn.Module]:
    """The Hugging Face causal LM a config describes, made on the meta
    device by transformers' own classes (its code, so its activations), or
    None where transformers is absent or does not know it."""
    try:
        import transformers
        rest = {k: v for k, v in config.items() if k != "model_type"}
        made = transformers.AutoConfig.for_model(config["model_type"], **rest)
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(made)
    except Exception:      # (absent, an unknown model_type, or a config it refuses)
        return None


def decoder_trace(module: torch.nn.Module, batch: int, seq: int) -> Optional[Traced]:
    """What a Hugging Face decoder's training forward on `batch` x `seq`
    token ids saves for backward, read on its meta twin (trace), or None
    where it cannot be copied or its forward cannot run on the meta device."""
    try:
        twin = meta_twin(module)
    except Exception:             # (something in it that cannot be copied)
        return None
    match_modes(twin, module)
    twin.train()
    try:
        return trace(twin, {"input_ids": torch.zeros(batch, seq, dtype=torch.long)}, True)
    except ValueError:            # (TraceFailed, or a forward that takes no input_ids)
        return None


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
    largest = _Largest()
    try:
        with torch.set_grad_enabled(training), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None), largest:
            out = torch.func.functional_call(module, own, args, kwargs)
    except Exception as err:     # (whatever the forward raises on the meta device)
        raise TraceFailed(f"torch_uvm: estimate could not run the module's forward on the meta "
                         f"device to read its activations ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); give the offload a "
                         f"budget= instead, from a measured run") from None
    output = sum(t.nbytes for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    first_float = next((t for t in own.values() if t.is_floating_point()), None)
    first = tensors[0]
    sequence = first.dim() >= 3 or (first.dim() == 2 and not first.is_floating_point())
    return Traced(saved=sum(t.nbytes for t in saved.values()), largest=largest.nbytes,
                  output=output, batch=first.shape[0] if first.dim() else 1,
                  seq=first.shape[1] if sequence else 1,
                  dtype_bytes=4 if first_float is None else first_float.element_size())
