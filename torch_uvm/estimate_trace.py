"""What a module's forward keeps for its backward, read by running it on the
meta device: estimate()'s activations for a module that is no Hugging Face
decoder (an MLP, a vision model), whose activations no formula knows.

The forward runs once through ``torch.func.functional_call`` with every
parameter and buffer replaced by a meta tensor of its shape, on meta
inputs of the shapes given: nothing is computed, copied or allocated, and
the module itself is not touched (on the CPU, on the meta device, anywhere).
"""
from __future__ import annotations

import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map


@dataclasses.dataclass
class Traced:
    saved: int       # bytes the forward saves for backward, the module's own tensors left out
    largest: int     # the largest tensor one operation made (a layer's work at once)
    output: int      # the bytes of the forward's output


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


def trace(module: torch.nn.Module, inputs, training: bool) -> Traced:
    """`inputs`: a tensor, or a tuple of the forward's arguments (tensors of
    the shapes and dtypes a step feeds it, on any device: only those are
    read). ValueError, naming the cause, when the forward cannot run on the
    meta device."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    if not any(isinstance(t, torch.Tensor) for t in tree_leaves(args)):
        raise ValueError(f"torch_uvm: estimate's inputs are the forward's arguments: a tensor "
                         f"or a tuple with tensors, got {type(inputs).__name__}")
    args = tree_map(lambda t: torch.empty_like(t, device="meta")
                    if isinstance(t, torch.Tensor) else t, args)
    own = {name: _meta(t) for name, t in
           list(module.named_parameters()) + list(module.named_buffers())}
    ids = {id(t) for t in own.values()}
    saved = {}

    def pack(t):
        base = t if t._base is None else t._base      # (a weight saved transposed is a view)
        if id(base) not in ids:
            saved[id(t)] = t
        return None
    largest = _Largest()
    try:
        with torch.set_grad_enabled(training), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None), largest:
            out = torch.func.functional_call(module, own, args)
    except (RuntimeError, NotImplementedError, TypeError) as err:
        raise ValueError(f"torch_uvm: estimate could not run the module's forward on the meta "
                         f"device to read its activations ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); give the offload a "
                         f"budget= instead, from a measured run") from None
    output = sum(t.nbytes for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    return Traced(saved=sum(t.nbytes for t in saved.values()), largest=largest.nbytes,
                  output=output)
