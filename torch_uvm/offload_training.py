"""Training an offloaded module under its residency budget.

* Backward needs each submodule's weights again, in reverse order: a hook on
  the submodule's forward output brings them back before its backward, and
  prefetches the `ahead` submodules that backward reaches next.
* The weights are not advised read-mostly (a write to a read-mostly page is
  a fault that collapses its copies, slow); counted as written, they migrate.
* Gradients and optimizer states are managed memory (UVM on), counted in the
  same budget as written ranges: when they leave the GPU they migrate home.
  A gradient set to None is forgotten, never migrated.
* The optimizer steps one submodule at a time (`Offloaded.stream_optimizer`):
  its weights, gradients and states are brought, the step runs on them alone,
  and the weights are marked written, so they migrate when they leave. The
  step's arithmetic is the optimizer's own, per element, so losses equal an
  all-resident run's.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Dict, List

import torch
from torch.utils._pytree import tree_leaves

from . import _C
from .residency import (_BUDGET, _LOCK, _RANGES, _Range, _admit_written, _bring, _range_for,
                        _set_busy)

if TYPE_CHECKING:
    from .offload import Offloaded, _Unit

# What one submodule's optimizer step holds on the GPU, in units of its
# weights: weights, gradients and two states (Adam's moments).
STEP_FOOTPRINT = 4


def trainable(unit: "_Unit") -> List[torch.nn.Parameter]:
    return [p for p in unit.module._parameters.values()
            if p is not None and p.requires_grad]


def install(handle: "Offloaded") -> None:
    """Hooks for backward: after each accumulated gradient, count it; when a
    submodule has all of its gradients, release its weights."""
    owner: Dict[int, "_Unit"] = {}
    # A tensor's hooks are held in C++, out of the collector's reach: one that
    # held the handle (or a unit, which holds its module) would keep a module
    # dropped without undo alive for good. They hold a weak reference.
    ref = weakref.ref(handle)
    for i, u in enumerate(handle.units):
        for p in trainable(u):
            if id(p) not in owner:    # a tied weight counts for its first user
                owner[id(p)] = u
                handle._handles.append(p.register_post_accumulate_grad_hook(
                    lambda p, ref=ref, i=i: _on_grad(ref, i, p)))
    for u in handle.units:
        u.grads_expected = sum(owner.get(id(p)) is u for p in trainable(u))


def after_forward(handle: "Offloaded", unit: "_Unit", output) -> None:
    """In a forward that builds a graph, hooks on `unit`'s outputs (tensors,
    containers, model outputs) run before its backward: the first one that
    fires brings the weights back."""
    if not torch.is_grad_enabled() or handle.mode != "prefetch":
        return
    armed = [True]

    def hook(_grad):
        if armed[0]:
            armed[0] = False
            before_backward(handle, unit)
    leaves = tree_leaves(output) if not hasattr(output, "to_tuple") else list(output.to_tuple())
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.register_hook(hook)


def before_backward(handle: "Offloaded", unit: "_Unit") -> None:
    compute = torch.cuda.current_stream(handle.device)
    with _LOCK:
        if unit.ready is not None:
            compute.wait_event(unit.ready)
            unit.ready = None
        _bring(unit.ranges, handle.device, compute, True)
        _set_busy(unit.ranges, True)
        unit.grads_seen = 0
        order = handle.order[::-1]
        i = order.index(unit)
        for u in [u for u in order[i + 1:] if not u.resident][:handle.ahead]:
            if u.ready is None:
                with torch.cuda.stream(handle.side):
                    _bring(u.ranges, handle.device, handle.side, True)
                    u.ready = handle.side.record_event()
                _set_busy(u.ranges, True)


def _on_grad(ref: "weakref.ref[Offloaded]", i: int, p: torch.nn.Parameter) -> None:
    handle = ref()
    if handle is not None:
        grad_ready(handle, handle.units[i], p)


def grad_ready(handle: "Offloaded", unit: "_Unit", p: torch.nn.Parameter) -> None:
    grad = p.grad
    if grad is None:
        return
    if not _C.is_managed(grad):
        raise RuntimeError(
            f"torch_uvm: the gradient of '{unit.name}' is not managed memory, so the residency "
            "budget cannot hold it. Training an offloaded module needs UVM on: call "
            "torch_uvm.set_enabled_uvm(True) (or set PYTORCH_ENABLE_UNIFIED_MEMORY=1) before "
            "the first backward")
    compute = torch.cuda.current_stream(handle.device)
    r = _range_for(grad, track=True)
    r.last_use = compute.record_event()   # written by kernels still queued
    _admit_written([r], handle.device, compute)
    unit.grads_seen += 1
    if unit.grads_seen >= unit.grads_expected and not unit.resident:
        for w in unit.ranges:
            w.last_use = r.last_use
        handle._unpin(unit.ranges)


def state_tensors(optimizer: torch.optim.Optimizer, p) -> List[torch.Tensor]:
    return [t for t in optimizer.state.get(p, {}).values()
            if isinstance(t, torch.Tensor) and t.is_cuda and _C.is_managed(t)]


def check_optimizer(handle: "Offloaded", optimizer: torch.optim.Optimizer) -> None:
    if handle.learned and not handle.training:
        raise ValueError(
            "torch_uvm: this offload was planned for inference (its first forward ran without "
            "grad). To train, undo() it and offload again, then run the first forward with grad")
    ours = {id(p) for u in handle.units for p in u.module._parameters.values() if p is not None}
    foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in ours]
    if foreign:
        raise ValueError(
            f"torch_uvm: the optimizer holds {len(foreign)} parameter(s) that are not the "
            "offloaded module's: offload replaces the module's parameters, so create the "
            "optimizer after torch_uvm.offload")
    largest = max(handle.units, key=lambda u: u.nbytes)
    need = STEP_FOOTPRINT * largest.nbytes
    if need > handle.budget:
        raise ValueError(
            f"torch_uvm: a budget of {handle.budget} bytes cannot hold the optimizer step of "
            f"submodule '{largest.name}': its weights, gradients and two states take {need} "
            f"bytes. Raise the budget")


def step(handle: "Offloaded", optimizer: torch.optim.Optimizer, original_step):
    """`optimizer.step()` one submodule at a time, each within the budget."""
    device = handle.device
    compute = torch.cuda.current_stream(device)
    groups = optimizer.param_groups
    saved = [g["params"] for g in groups]
    with _LOCK:
        for u in handle.units:        # a unit left busy by a partial backward
            if not u.resident:
                handle._unpin(u.ranges)
                u.ready = None
    stepped: set = set()              # a tied weight steps once
    try:
        for u in handle.order or handle.units:
            params = [p for p in trainable(u) if p.grad is not None and id(p) not in stepped]
            if not params:
                continue
            ids = {id(p) for p in params}
            stepped |= ids
            grads = [_range_for(p.grad, track=True) for p in params]
            states = [_range_for(t, track=True) for p in params for t in state_tensors(optimizer, p)]
            ranges: List[_Range] = list(u.ranges) + grads + states
            _bring(ranges, device, compute, written=True)
            _set_busy(ranges, True)
            new: List[_Range] = []
            try:
                for g, all_params in zip(groups, saved):
                    g["params"] = [p for p in all_params if id(p) in ids]
                original_step()
                for g, all_params in zip(groups, saved):
                    g["params"] = all_params
                new = [_range_for(t, track=True) for p in params
                       for t in state_tensors(optimizer, p)]
                new = [r for r in new if all(r is not s for s in states)]
                done = compute.record_event()
                for r in ranges + new:
                    r.last_use = done
                _admit_written(new, device, compute)
                with _LOCK:
                    for r in u.ranges:
                        _BUDGET.mark_written(r.address)
            finally:
                handle._unpin(ranges + new)
                if u.resident:
                    _set_busy(u.ranges, True)
    finally:
        for g, all_params in zip(groups, saved):
            g["params"] = all_params


def forget(handle: "Offloaded") -> None:
    """On undo: the gradients and optimizer states of the module's
    parameters leave the budget's books (they stay where they are)."""
    tensors = [p.grad for u in handle.units for p in trainable(u) if p.grad is not None]
    tensors += [t for optimizer, _ in handle._optimizers for u in handle.units
                for p in trainable(u) for t in state_tensors(optimizer, p)]
    with _LOCK:
        for t in tensors:
            r = _RANGES.pop(t.data_ptr(), None)
            if r is not None:
                _BUDGET.forget(r.address)
