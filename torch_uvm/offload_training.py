"""Training an offloaded module under its budget: backward, gradients and the
optimizer. The bytes move in the C++ executor (csrc/torch/stream_executor.h);
this file decides when.

* Backward needs each submodule's weights again, in reverse order: a hook on
  the submodule's forward output brings them back before its backward, and
  the next `ahead` submodules that backward reaches are brought meanwhile.
* A submodule's gradients, once complete, are counted in the budget and
  written home at once by a copy (the parameters' ``.grad`` then live in
  host memory, and an optimizer can read them anywhere).
* ``optimizer.step()`` (after :meth:`Offloaded.stream_optimizer`) steps one
  submodule at a time: its weights, gradients and states come to the GPU,
  the optimizer's own step runs on them alone, and what it wrote goes home
  by a copy. States the step makes are adopted the same way. (A fused step
  reading its states in place in host memory moves as many bytes, but holds
  the GPU's SMs while it waits on PCIe, and the backward's kernels beside it
  wait too: copy engines hold none. benchmarks/results/*-s10-mechanisms-uvm-*.log,
  contention.) The step's arithmetic is the optimizer's own, per element, so
  losses equal an all-resident run's.
* With ``step_in_backward``, a submodule steps as soon as its gradients are
  complete, while its weights are still on the GPU; its gradients are then
  set to None and never leave the GPU. The step runs on a stream of its own,
  after the backward's work so far: its wait for the states' copy and the
  step overlap the backward of the submodules before it instead of delaying
  it. The end of backward waits for every step.
"""
from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Dict, List

import torch
from torch.utils._pytree import tree_leaves

if TYPE_CHECKING:
    from .offload import Offloaded, _Unit

# Room made on the GPU for an optimizer's first states, in parameters' bytes.
FIRST_STATES = 2

# Per optimizer, the parameters it stepped at least once: a parameter that
# has no state after its first step (SGD without momentum) gets no room for
# first states again.
# (ids: the optimizer holds its parameters while it is a key here)
_STEPPED: "weakref.WeakKeyDictionary[torch.optim.Optimizer, set]" = weakref.WeakKeyDictionary()


class BackwardState:
    """What one offload knows of the backward under way."""
    __slots__ = ("active", "frozen_running", "stepped_since_step", "step_stream")

    def __init__(self):
        self.active = False           # a backward runs: its end is queued
        self.frozen_running: List["_Unit"] = []   # brought, no gradient will release them
        self.stepped_since_step = False           # step_in_backward stepped, step() not called
        self.step_stream = None       # step_in_backward's steps run on it (made when first needed)


def trainable(unit: "_Unit") -> List[torch.nn.Parameter]:
    return [p for p in unit.module._parameters.values()
            if p is not None and p.requires_grad]


def install(handle: "Offloaded") -> None:
    """Hooks for backward: after each accumulated gradient, count it; when a
    submodule has all of its gradients, hand them to the executor. A tied
    weight streams its gradient with its first user."""
    owner: Dict[int, "_Unit"] = {}
    # A tensor's hooks are held in C++, out of the collector's reach: one that
    # held the handle (or a unit, which holds its module) would keep a module
    # dropped without undo alive for good. They hold a weak reference.
    ref = weakref.ref(handle)
    for i, u in enumerate(handle.units):
        for p in trainable(u):
            if id(p) not in owner:
                owner[id(p)] = u
                u.trainable.append(p)
                handle._handles.append(p.register_post_accumulate_grad_hook(
                    lambda p, ref=ref, i=i: _on_grad(ref, i)))
    for u in handle.units:
        u.grads_expected = len(u.trainable)


def after_forward(handle: "Offloaded", unit: "_Unit", output) -> None:
    """In a forward that builds a graph, hooks on `unit`'s outputs (tensors,
    containers, model outputs) run before its backward: the first one that
    fires brings the weights back."""
    if not torch.is_grad_enabled() or handle.executor is None:
        return
    armed = [True]
    ref = weakref.ref(handle)

    def hook(_grad):
        h = ref()
        if armed[0] and h is not None:
            armed[0] = False
            before_backward(h, unit)
    leaves = tree_leaves(output) if not hasattr(output, "to_tuple") else list(output.to_tuple())
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.register_hook(hook)


def before_backward(handle: "Offloaded", unit: "_Unit") -> None:
    state = handle._backward
    if not state.active:
        if handle.step_in_backward and state.stepped_since_step:
            raise RuntimeError(
                "torch_uvm: a second backward before optimizer.step(): with step_in_backward, "
                "each submodule already stepped during the last backward. Call "
                "optimizer.step() after every backward; to accumulate gradients over several, "
                "use stream_optimizer(optimizer, step_in_backward=False)")
        state.active = True
        ref = weakref.ref(handle)
        torch.autograd.Variable._execution_engine.queue_callback(lambda: _end_backward(ref))
    executor = handle.executor
    # submodules without gradients of their own were running: done by now
    for u in state.frozen_running:
        executor.after(u.index)
    state.frozen_running.clear()
    executor.before(unit.index, True)
    unit.grads_seen = 0
    if unit.grads_expected == 0:
        state.frozen_running.append(unit)


def _on_grad(ref: "weakref.ref[Offloaded]", i: int) -> None:
    handle = ref()
    if handle is None or handle.executor is None:
        return
    unit = handle.units[i]
    unit.grads_seen += 1
    if unit.grads_seen == unit.grads_expected:
        _grads_complete(handle, unit)


def _grads_complete(handle: "Offloaded", unit: "_Unit") -> None:
    executor = handle.executor
    if not handle.step_in_backward or not handle._optimizers:
        executor.grads_ready(unit.index, True)
        return
    executor.grads_ready(unit.index, False)
    state = handle._backward
    if state.step_stream is None:
        state.step_stream = torch.cuda.Stream(handle.device)
    state.step_stream.wait_stream(torch.cuda.current_stream(handle.device))
    # On the step stream, the executor's bring waits there, step_done's copies
    # home wait for it, and the gradients' memory is let go after it.
    with torch.cuda.stream(state.step_stream):
        for optimizer, own in handle._optimizers:
            _step_unit(handle, optimizer, own, unit, with_grads=False)
        for p in unit.trainable:
            p.grad = None
        executor.discard_grads(unit.index)
    unit.stepped = True
    state.stepped_since_step = True


def _end_backward(ref: "weakref.ref[Offloaded]") -> None:
    handle = ref()
    if handle is None or handle.executor is None:
        return
    state = handle._backward
    state.active = False
    state.frozen_running.clear()
    if state.step_stream is not None:  # what follows sees every step's writes
        torch.cuda.current_stream(handle.device).wait_stream(state.step_stream)
    for u in handle.units:            # some gradients never came (an unused branch)
        if 0 < u.grads_seen < u.grads_expected:
            u.grads_seen = 0
            handle.executor.grads_ready(u.index, True)
    handle.executor.end_pass()


def state_tensors(optimizer: torch.optim.Optimizer, p) -> List[torch.Tensor]:
    return [t for t in optimizer.state.get(p, {}).values()
            if isinstance(t, torch.Tensor) and t.is_cuda]


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
    from .offload import window_bytes
    largest = max(handle.units, key=lambda u: u.nbytes)
    need = window_bytes(handle.mode, True, handle.ahead, largest.nbytes)
    if need > handle.budget:
        raise ValueError(
            f"torch_uvm: a budget of {handle.budget} bytes cannot hold the optimizer step of "
            f"submodule '{largest.name}': with ahead + 1 = {handle.ahead + 1} submodules "
            f"streaming, its weights, gradients and two states take {need} bytes. Raise the "
            f"budget or lower ahead")


def _step_unit(handle: "Offloaded", optimizer, own, unit: "_Unit", with_grads: bool) -> bool:
    """The optimizer's own step on `unit`'s parameters alone, on the GPU.
    Returns whether it stepped anything."""
    groups = optimizer.param_groups
    ids = {id(p) for p in unit.trainable if p.grad is not None}
    if not ids:
        return False
    params = [p for p in unit.trainable if id(p) in ids]
    # held for the step either way: bringing the states may need room, and
    # gradients not held could be sent home under the step's feet
    held = [p.grad for p in params]
    grads = held if with_grads else []
    before = [t for p in params for t in state_tensors(optimizer, p)]
    executor = handle.executor
    # a first step makes its states on the GPU: room for Adam's two a
    # parameter is made first (SGD's momentum takes one; an optimizer that
    # makes more is counted when they exist, and the next bring waits)
    stepped = _STEPPED.setdefault(optimizer, set())
    fresh = sum(p.nbytes for p in params if id(p) not in stepped and not optimizer.state.get(p))
    executor.bring(params + held + before, FIRST_STATES * fresh)
    saved = [g["params"] for g in groups]
    try:
        for g, all_params in zip(groups, saved):
            g["params"] = [p for p in all_params if id(p) in ids]
        own()
        stepped.update(id(p) for p in params)
    finally:
        for g, all_params in zip(groups, saved):
            g["params"] = all_params
        after = [t for p in params for t in state_tensors(optimizer, p)]
        # (also when the step failed half-way: what it may have written goes home)
        executor.step_done(params + grads + after, params + after)
    return True


def step(handle: "Offloaded", optimizer: torch.optim.Optimizer, original_step) -> None:
    """`optimizer.step()` one submodule at a time, each within the budget.
    Submodules that stepped in backward (step_in_backward) are skipped."""
    if handle.executor is None:
        return
    handle.executor.step_begins()     # the gradients as the compute stream left them
    stepped: List[str] = []
    try:
        for u in handle.units_in_order():
            if u.stepped:
                continue
            try:
                if _step_unit(handle, optimizer, original_step, u, with_grads=True):
                    stepped.append(u.name)
            except BaseException as e:
                note = (f"torch_uvm: the streamed optimizer step failed in submodule '{u.name}'; "
                        f"{len(stepped)} submodule(s) had stepped: {stepped[:8]}"
                        f"{' ...' if len(stepped) > 8 else ''}. Nothing is held on the GPU for it; "
                        f"the module is consistent (undo() gives it back)")
                if sys.version_info >= (3, 11):
                    e.add_note(note)
                    raise
                raise RuntimeError(note) from e
    finally:
        for u in handle.units:
            u.stepped = False
        handle._backward.stepped_since_step = False
        handle.executor.end_pass()


def forget(handle: "Offloaded") -> None:
    """On undo: the optimizers' step is theirs again."""
    for optimizer, _ in handle._optimizers:
        optimizer.__dict__.pop("step", None)   # the class's step again
    handle._optimizers.clear()
