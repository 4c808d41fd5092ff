"""Clipping by PyTorch's functions is never silent under step_in_backward.

With ``stream_optimizer(step_in_backward=True)`` each submodule steps as soon
as its gradients are complete, and its gradients are then gone: a global
norm taken after backward would see none of them and clip nothing (it
returned 0.0). No exact clipping by global norm exists there, since the
first submodules step before the last gradients exist (torchtune refuses
clipping with its optimizer in backward for the same reason). So once an
offload steps in backward, ``torch.nn.utils.clip_grad_norm_`` and
``clip_grad_value_`` (which the Hugging Face ``Trainer``, accelerate and
Lightning call by their module attribute) first ask each such offload
whether the parameters they were given stepped in this backward, and raise
if so, naming ``step_in_backward`` and the way out. Parameters of no such
offload clip as PyTorch clips them; the functions are PyTorch's own."""
from __future__ import annotations

import functools
import weakref
from typing import Callable, List

import torch

# The offloads that step in backward (each has stepped_in_backward(params)).
_WATCHED: "weakref.WeakSet" = weakref.WeakSet()
_NAMES = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_")


def watch(state) -> None:
    """An offload (its OffloadState) steps in backward: PyTorch's clipping
    checks its parameters from now on (the functions are wrapped once per
    process)."""
    _WATCHED.add(state)
    _wrap_once()


def unwatch(state) -> None:
    """It steps in backward no more (undone)."""
    _WATCHED.discard(state)


def stepped(params: List[torch.Tensor]) -> List[str]:
    """The submodules among `params`' that stepped in this backward."""
    return [name for h in list(_WATCHED) for name in h.stepped_in_backward(params)]


def _guarded(clip: Callable, what: str) -> Callable:
    @functools.wraps(clip)
    def guarded(parameters, *args, **kwargs):
        if _WATCHED:
            parameters = [parameters] if isinstance(parameters, torch.Tensor) else \
                list(parameters)
            names = stepped(parameters)
            if names:
                raise RuntimeError(
                    f"torch_uvm: {what} over parameters whose gradients already stepped in "
                    f"this backward (stream_optimizer(step_in_backward=True), or "
                    f"torch_uvm.fsdp.step_in_backward): "
                    f"{names[:4]}{' ...' if len(names) > 4 else ''}. Their gradients are "
                    f"gone, so nothing would be clipped. To clip, step after backward: "
                    f"stream_optimizer(optimizer) without step_in_backward, or FSDP2 without "
                    f"fsdp.step_in_backward (the Hugging Face Trainer clips by default: "
                    f"max_grad_norm=1.0); to step in backward, do not clip (Trainer: "
                    f"max_grad_norm=0)")
        return clip(parameters, *args, **kwargs)
    guarded._torch_uvm_guard = True
    return guarded


def _wrap_once() -> None:
    for home in (torch.nn.utils, torch.nn.utils.clip_grad):
        for name in _NAMES:
            clip = getattr(home, name, None)
            if clip is not None and not getattr(clip, "_torch_uvm_guard", False):
                setattr(home, name, _guarded(clip, f"torch.nn.utils.{name}"))
