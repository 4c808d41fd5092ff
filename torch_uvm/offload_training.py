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
  wait too: copy engines hold none. benchmarks/results/2026-11-23-h100/mechanisms-uvm-*.log,
  contention.) The step's arithmetic is the optimizer's own, per element, so
  losses equal an all-resident run's.
* With ``step_in_backward``, a submodule steps as soon as its gradients are
  complete, while its weights are still on the GPU; its gradients are then
  set to None and never leave the GPU. The step runs on a stream of its own,
  after the backward's work so far: its wait for the states' copy and the
  step overlap the backward of the submodules before it instead of delaying
  it. The end of backward waits for every step.
* What trains follows ``requires_grad`` at each forward that builds a graph
  (frozen parameters need no room for gradients or states; unfrozen ones
  get their hooks then). A streamed optimizer stays a ``torch.optim``
  optimizer for trainers: ``step(closure)``, ``load_state_dict`` into the
  states' homes, parameters that are not offloaded stepped as they are.
"""
from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Dict, List

import torch
from torch.utils._pytree import tree_leaves

from . import _C, host_step
from .narrowed_step import step_over
from .offload_state import STEPS_BEHIND

if TYPE_CHECKING:
    from .offload_state import OffloadState
    from .offload_units import Unit

# Room made on the GPU for an optimizer's first states, in parameters' bytes.
FIRST_STATES = 2

# Per optimizer, the parameters it stepped at least once: a parameter that
# has no state after its first step (SGD without momentum) gets no room for
# first states again.
# (ids: the optimizer holds its parameters while it is a key here)
_STEPPED: "weakref.WeakKeyDictionary[torch.optim.Optimizer, set]" = weakref.WeakKeyDictionary()


def _raise_with_note(e: BaseException, note: str):
    """Raises `e` again with torch_uvm's note on what it left (on Python
    before 3.11, a RuntimeError saying it, from `e`)."""
    if sys.version_info >= (3, 11):
        e.add_note(note)
        raise e
    raise RuntimeError(note) from e


def install(state: "OffloadState") -> None:
    """Each submodule's parameters (a tied weight streams its gradient with
    its first user), and hooks for those that require grad now."""
    owner = set()
    for u in state.units:
        for p in (p for m in u.members for p in m._parameters.values()):
            if p is not None and id(p) not in owner:
                owner.add(id(p))
                u.params.append(p)
    state.param_ids = owner
    # Gradients are counted in C++ (csrc/torch/gradient_hooks.h): Python
    # hears of a unit once, when its last gradient came. The hooks are held
    # in C++, out of the collector's reach: the call holds a weak reference
    # (one that held the state, or a unit, would keep a module dropped
    # without undo alive for good).
    ref = weakref.ref(state)
    state.gradient_hooks = _C.GradientHooks(state.lifecycle, lambda i: _grads_done(ref, i))
    state.hooks.append(state.gradient_hooks)    # (undo() removes them)
    follow_trainable(state)


def follow_trainable(state: "OffloadState") -> None:
    """Each unit's trainable parameters as ``requires_grad`` says now
    (progressive unfreezing, a GAN's discriminator frozen for the
    generator's step): their gradients are counted, and when a submodule
    has all of its gradients they go to the executor."""
    for i, u in enumerate(state.units):
        now = [p for p in u.params if p.requires_grad]
        if len(now) == len(u.trainable) and all(a is b for a, b in zip(now, u.trainable)):
            continue
        for p in now:
            state.gradient_hooks.add(i, p)    # (once a parameter)
        u.trainable = now
        state.lifecycle.set_expected(i, len(now))
        if state.executor is not None:
            state.executor.set_trainable(u.index, now)


def after_forward(state: "OffloadState", unit: "Unit", output) -> None:
    """In a forward that builds a graph, hooks on `unit`'s outputs (tensors,
    containers, model outputs) run before its backward: the first one that
    fires brings the weights back."""
    if not torch.is_grad_enabled() or state.executor is None:
        return
    armed = [True]
    ref = weakref.ref(state)

    def hook(_grad):
        h = ref()
        if armed[0] and h is not None:
            armed[0] = False
            before_backward(h, unit)
    leaves = tree_leaves(output) if not hasattr(output, "to_tuple") else list(output.to_tuple())
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.register_hook(hook)


def before_backward(state: "OffloadState", unit: "Unit") -> None:
    life = state.lifecycle
    opened, released = life.backward_begins(unit.index, state.step_in_backward)
    if opened:
        life.set_host_units([u.index for u in host_step.choose(state)])
        ref = weakref.ref(state)
        torch.autograd.Variable._execution_engine.queue_callback(lambda: _end_backward(ref))
    executor = state.executor
    for i in released:    # submodules without gradients of their own were running: done by now
        executor.after(i)
    if state.host_steps.pending:     # (a graph built before a non_blocking step: its own first)
        state.host_steps.wait_unit(unit.index)
    executor.before(unit.index, True)


def _grads_done(ref: "weakref.ref[OffloadState]", i: int) -> None:
    """Unit `i`'s last gradient of this backward came (counted per backward,
    autograd's graph task, whether or not the unit's own backward began: a
    tied weight, a regularizer over it)."""
    state = ref()
    if state is None or state.executor is None:
        return
    _grads_complete(state, state.units[i])


def _grads_complete(state: "OffloadState", unit: "Unit") -> None:
    executor = state.executor
    life = state.lifecycle
    if not state.step_in_backward or not state.optimizers:
        executor.grads_ready(unit.index, True)
        return
    # (refused if it stepped in this backward already)
    if life.steps_in_backward(unit.index):
        # on the host: home without the backward waiting for the copy; if
        # the host cannot take it now, optimizer.step() steps it
        executor.grads_ready(unit.index, True, False)
        if state.host_steps.submit(state, unit, state.optimizers, in_backward=True):
            for p in unit.trainable:    # (those no optimizer steps too, as on the GPU)
                p.grad = None
            life.stepped(unit.index, in_backward=True)
        return
    executor.grads_ready(unit.index, False)
    if state.step_stream is None:
        state.step_stream = torch.cuda.Stream(state.device)
    state.step_stream.wait_stream(torch.cuda.current_stream(state.device))
    # On the step stream, the executor's bring waits there, step_done's copies
    # home wait for it, and the gradients' memory is let go after it.
    with torch.cuda.stream(state.step_stream):
        for optimizer, own in state.optimizers:
            _step_unit(state, optimizer, own, unit, with_grads=False)
        for p in unit.trainable:
            p.grad = None
        executor.discard_grads(unit.index)
        # The gradients' memory is reused only once their step ran, and the
        # steps may lag the backward: it goes on with at most STEPS_BEHIND
        # under way (the host waits for the oldest here).
        executor.step_queued(STEPS_BEHIND)
    life.stepped(unit.index, in_backward=True)


def _end_backward(ref: "weakref.ref[OffloadState]") -> None:
    state = ref()
    if state is None or state.executor is None:
        return
    finish_backward(state)


def end_failed_backward(state: "OffloadState") -> None:
    """A backward that raised half-way never reached its end (autograd runs
    no queued callback then): before the next forward, outside any
    backward, it ends now."""
    if state.lifecycle.backward_active() and torch._C._current_graph_task_id() == -1:
        finish_backward(state)


def finish_backward(state: "OffloadState") -> None:
    """The end of a backward: the compute stream waits for the steps in
    backward, gradients that came only in part go home, holds end."""
    partial = state.lifecycle.end_backward()
    if state.step_stream is not None:  # what follows sees every step's writes
        torch.cuda.current_stream(state.device).wait_stream(state.step_stream)
    for i in partial:                # some gradients never came (an unused branch)
        state.executor.grads_ready(i, True)
    state.executor.end_pass()


def state_tensors(optimizer: torch.optim.Optimizer, p) -> List[torch.Tensor]:
    return [t for t in optimizer.state.get(p, {}).values()
            if isinstance(t, torch.Tensor) and t.is_cuda]


def why_budget(state: "OffloadState", need: int) -> str:
    """What a training budget must hold, and the least that does."""
    largest = max(state.units, key=lambda u: u.nbytes)
    stepped = max(state.units, key=lambda u: u.trainable_bytes)
    return (f"with ahead + 1 = {state.ahead + 1} submodules streaming, the largest "
            f"('{largest.name}', {largest.nbytes} bytes), and a step of the largest trainable "
            f"one ('{stepped.name}': its weights, gradients and two states) it needs at least "
            f"{need} bytes ({need / 2**20:.0f} MiB). Give it at least that budget, lower "
            f"ahead, or freeze more of it")


def _holders(state: "OffloadState", optimizer, others) -> Dict[str, list]:
    """The optimizer's parameters by whose they are: "ours", "originals"
    (the module's tensors before offload replaced them), another offload's
    holder name, or "plain" (not offloaded)."""
    ours = state.param_ids
    originals = state.replaced_ids
    theirs = {id(p): type(o.module).__name__ for o in others for u in o.units for p in u.params}
    found: Dict[str, list] = {}
    for g in optimizer.param_groups:
        for p in g["params"]:
            whose = ("ours" if id(p) in ours else "originals" if id(p) in originals
                     else theirs.get(id(p), "plain"))
            found.setdefault(whose, []).append(p)
    return found


def _refuse_holders(found: Dict[str, list]) -> None:
    if "originals" in found:
        raise ValueError(
            f"torch_uvm: the optimizer holds {len(found['originals'])} of the module's "
            "parameters as they were before offload, which replaced them: create the optimizer "
            "after torch_uvm.offload (from module.parameters() then)")
    others = [k for k in found if k not in ("ours", "plain", "originals")]
    if others:
        raise ValueError(
            f"torch_uvm: the optimizer holds parameters of another offloaded module "
            f"({', '.join(repr(o) for o in others)}): each offload streams an optimizer of its "
            "own. Create one optimizer per offloaded module (a GAN's generator and "
            "discriminator each get theirs) and stream each with its own offload's "
            "stream_optimizer")


def check_optimizer(state: "OffloadState", optimizer: torch.optim.Optimizer, others) -> None:
    """Refuses, before anything changes, an optimizer that cannot stream
    with this offload (`others`: the other offloads not undone)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError(
            "torch_uvm: LBFGS cannot be streamed: its step evaluates the closure several times "
            "and updates every parameter at once, where a streamed step updates one submodule "
            "at a time within the budget. Use an optimizer that steps each parameter on its "
            "own (SGD, Adam, AdamW, ...), or undo the offload")
    if state.streams(optimizer):
        raise ValueError("torch_uvm: this optimizer is streamed by this offload already")
    for other in others:
        if other.streams(optimizer):
            raise ValueError(
                f"torch_uvm: this optimizer is streamed by another offload (of "
                f"'{type(other.module).__name__}') already: each offload streams an optimizer of "
                "its own, over its own parameters")
    _refuse_holders(_holders(state, optimizer, others))
    follow_trainable(state)
    need = state.least_budget(training=True)
    if need > state.budget:
        raise ValueError(f"torch_uvm: a budget of {state.budget} bytes cannot train this "
                         f"module: {why_budget(state, need)}")


def check_params(state: "OffloadState", optimizer: torch.optim.Optimizer, others) -> None:
    """At each step: parameters added since (add_param_group) may not be
    the module's old ones nor another offload's."""
    _refuse_holders(_holders(state, optimizer, others))


def run_closure(state: "OffloadState", closure):
    """`step(closure)`: the closure's forward and backward, as
    ``torch.optim`` runs it. If it raises, what its backward left is let go
    of, and the error says what stepped (step_in_backward)."""
    try:
        with torch.enable_grad():
            return closure()
    except BaseException as e:
        stepped = [state.units[i].name for i in state.lifecycle.step_ends()]
        if state.executor is not None:
            end_failed_backward(state)
            state.executor.end_pass()
        note = ("torch_uvm: the optimizer's closure raised, so step() stepped nothing"
                + (f"; {len(stepped)} submodule(s) had stepped in its backward "
                   f"(step_in_backward): {stepped[:8]}{' ...' if len(stepped) > 8 else ''}"
                   if stepped else "")
                + ". Nothing is held on the GPU for it; the module is consistent (undo() "
                  "gives it back)")
        _raise_with_note(e, note)


def keep_states_home(state: "OffloadState", optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's states of streamed parameters live in homes: those it
    has now (loaded before streaming) go there, and so do those
    ``load_state_dict`` loads (it would cast every state to its parameter's
    device, all to the GPU at once): into the homes the states had, or new
    ones. ``state_dict`` gives them as CPU tensors over their homes."""
    ours = state.param_ids
    for p, st in optimizer.state.items():
        if id(p) in ours:
            for key, t in list(st.items()):
                if _streamable(t) and not _C.is_pinned_home(t):
                    st[key] = _C.pinned_home(t.detach(), state.device)

    def to_homes(opt, state_dict):
        state.host_steps.wait()             # no host step writes the homes loaded below
        params = [p for g in opt.param_groups for p in g["params"]]
        saved = [i for g in state_dict.get("param_groups", []) for i in g["params"]]
        if len(saved) != len(params):
            return None          # load_state_dict refuses it, naming why
        by_saved = dict(zip(saved, params))
        loaded = {}
        for k, values in state_dict.get("state", {}).items():
            p = by_saved.get(k)
            if p is None or id(p) not in ours:
                loaded[k] = values
                continue
            had = opt.state.get(p, {})
            loaded[k] = dict(values)
            for key, v in values.items():
                if key == "step" or not _streamable(v, on_gpu=False):
                    continue
                if p.is_floating_point():    # as load_state_dict casts it
                    v = v.to(dtype=p.dtype)
                old = had.get(key)
                if isinstance(old, torch.Tensor) and old.shape == v.shape and \
                        old.dtype == v.dtype and _C.is_pinned_home(old):
                    with torch.no_grad():
                        old.copy_(v)          # its home, written in place
                    loaded[k][key] = old
                else:
                    loaded[k][key] = _C.pinned_home(v, state.device)
        return {**state_dict, "state": loaded}
    def seen_on_cpu(opt, state_dict):
        # A checkpoint saves the states as CPU tensors: those at home over
        # their homes' memory, those in a slot (within the budget) copied.
        # Loaded without map_location (as Lightning does), they land in
        # host memory, not all on the GPU at once. The live states stay.
        torch.cuda.synchronize(state.device)    # the copies home have passed
        params = [p for g in opt.param_groups for p in g["params"]]
        saved = [i for g in state_dict["param_groups"] for i in g["params"]]
        streamed = {k for k, p in zip(saved, params) if id(p) in ours}
        states = {}
        for k, values in state_dict["state"].items():
            states[k] = {key: _on_cpu(v) for key, v in values.items()} if k in streamed \
                else values
        return {**state_dict, "state": states}
    state.hooks.append(optimizer.register_load_state_dict_pre_hook(to_homes))
    # (before state_dict reads the states: a first host step may be adding some)
    state.hooks.append(optimizer.register_state_dict_pre_hook(
        lambda opt: state.host_steps.wait()))
    state.hooks.append(optimizer.register_state_dict_post_hook(seen_on_cpu))


def _on_cpu(t):
    """A streamed parameter's state as a checkpoint saves it
    (keep_states_home): over its home where it is at home, else a copy
    (a state in a slot, within the budget; one loaded and not yet
    stepped; a small one a host step keeps in a home of its own)."""
    if not _streamable(t) and not (isinstance(t, torch.Tensor) and t.is_cuda
                                   and _C.is_pinned_home(t)):
        return t
    home = _C.home_on_cpu(t)
    return home if home is not None else t.detach().cpu()


def _streamable(t, on_gpu: bool = True) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_cuda or not on_gpu) and \
        t.nbytes >= _C.SMALLEST_STREAMED_STATE


def _step_unit(state: "OffloadState", optimizer, own, unit: "Unit", with_grads: bool,
               kwargs=None) -> bool:
    """The optimizer's own step on `unit`'s parameters alone, on the GPU.
    Returns whether it stepped anything. Every parameter with a gradient
    steps, as PyTorch's step does: one frozen since it kept its gradient
    (``zero_grad(set_to_none=False)``) too, its momentum moving it."""
    ids = {id(p) for p in unit.params if p.grad is not None}
    if not ids:
        return False
    params = [p for p in unit.params if id(p) in ids]
    # held for the step either way: bringing the states may need room, and
    # gradients not held could be sent home under the step's feet
    held = [p.grad for p in params]
    grads = held if with_grads else []
    before = [t for p in params for t in state_tensors(optimizer, p)]
    executor = state.executor
    # a first step makes its states on the GPU: room for Adam's two a
    # parameter is made first (SGD's momentum takes one; an optimizer that
    # makes more is counted when they exist, and the next bring waits)
    stepped = _STEPPED.setdefault(optimizer, set())
    fresh = sum(p.nbytes for p in params if id(p) not in stepped and not optimizer.state.get(p))
    executor.bring(params + held + before, FIRST_STATES * fresh)
    if state.host_step:
        host_step.steps_to_gpu(optimizer, params)
    try:
        step_over(optimizer, own, ids, kwargs or {})
        stepped.update(id(p) for p in params)
    finally:
        after = [t for p in params for t in state_tensors(optimizer, p)]
        # (also when the step failed half-way: what it may have written goes home)
        executor.step_done(params + grads + after, params + after)
    return True


def step(state: "OffloadState", optimizer: torch.optim.Optimizer, original_step,
         kwargs=None) -> None:
    """`optimizer.step()` one submodule at a time, each within the budget.
    Submodules that stepped in backward (step_in_backward) are skipped;
    parameters that are not offloaded step last, as they are."""
    kwargs = kwargs or {}
    ours = state.param_ids
    plain = {id(p) for g in optimizer.param_groups for p in g["params"]
             if id(p) not in ours and p.grad is not None}
    if state.executor is None:        # no forward ran: nothing of ours has a gradient
        if plain:
            step_over(optimizer, original_step, plain, kwargs)
        return
    end_failed_backward(state)
    state.executor.step_begins()     # the gradients as the compute stream left them
    stepped: List[str] = []
    try:
        mine = [(optimizer, original_step)]
        life = state.lifecycle
        for u in host_step.choose(state):   # the host steps them while the GPU steps the rest
            if not life.has_stepped(u.index) and \
                    state.host_steps.submit(state, u, mine, in_backward=False):
                life.stepped(u.index, in_backward=False)
                stepped.append(u.name)
        skip = set(life.stepped_units())    # (in backward, or on the host)
        for u in state.units_in_order():
            if u.index in skip:
                continue
            try:
                if _step_unit(state, optimizer, original_step, u, with_grads=True,
                              kwargs=kwargs):
                    stepped.append(u.name)
            except BaseException as e:
                note = (f"torch_uvm: the streamed optimizer step failed in submodule '{u.name}'; "
                        f"{len(stepped)} submodule(s) had stepped: {stepped[:8]}"
                        f"{' ...' if len(stepped) > 8 else ''}. Nothing is held on the GPU for it; "
                        f"the module is consistent (undo() gives it back)")
                _raise_with_note(e, note)
        if plain:
            step_over(optimizer, original_step, plain, kwargs)
    except BaseException:
        try:
            state.host_steps.wait()       # its error would hide the one raised here
        except Exception:             # the first error is the one to see
            pass
        raise
    finally:
        try:
            state.host_steps.end_step()   # as torch.optim promises: every weight stepped
            # (unless non_blocking: then each unit's next forward waits for its own)
        finally:
            state.lifecycle.step_ends()
            state.executor.end_pass()


def states_back(state: "OffloadState", devices: Dict[int, torch.device]) -> Dict[tuple, dict]:
    """On undo: the states each streamed optimizer keeps of a streamed
    parameter, where the parameter goes back (`devices`, by the streamed
    parameter's id): on the CPU, over their homes (no copy); on a GPU,
    copies there. Made before anything is put back (may run out of memory)."""
    moved = {}
    for optimizer, _ in state.optimizers:
        # a fused or capturable step keeps its count on the parameter's device
        on_device = {id(p) for g in optimizer.param_groups if g.get("fused") or g.get("capturable")
                     for p in g["params"]}
        for p, st in optimizer.state.items():
            device = devices.get(id(p))
            if device is None:
                continue
            new = dict(st)
            for key, t in st.items():
                if not isinstance(t, torch.Tensor):
                    continue
                if key == "step" and not t.is_cuda and \
                        (device.type == "cpu" or id(p) not in on_device):
                    continue                  # (a step count stays on the CPU, as PyTorch's)
                if device.type == "cpu":      # over its home, or a copy (a small state)
                    new[key] = _on_cpu(t) if t.is_cuda else t
                    if new[key].is_cuda:
                        new[key] = t.detach().cpu()
                elif t.is_cuda or t.device != device:   # (a CUDA tensor may be in host memory)
                    new[key] = t.detach().to(device, copy=True)
            moved[(id(optimizer), id(p))] = new
    return moved


def hand_back(state: "OffloadState", back: Dict[int, torch.Tensor], moved: Dict[tuple, dict]) -> None:
    """On undo: each streamed optimizer steps the parameters put back
    (`back`, by the streamed parameter's id), its states keyed by them and
    where they are (states_back). Else it would go on stepping tensors no
    module holds, and the module's own not at all."""
    for optimizer, _ in state.optimizers:
        for group in optimizer.param_groups:
            group["params"] = [back.get(id(p), p) for p in group["params"]]
        states = optimizer.state
        for p in [p for p in states if id(p) in back]:
            st = states.pop(p)
            states[back[id(p)]] = moved.get((id(optimizer), id(p)), st)


def forget(state: "OffloadState") -> None:
    """On undo: the optimizers' step is theirs again."""
    state.host_steps.close()
    for optimizer, _ in state.optimizers:
        optimizer.__dict__.pop("step", None)   # the class's step again
        _STEPPED.pop(optimizer, None)          # (streamed again, it starts afresh)
    state.optimizers.clear()
