"""Model offload: a module's weights streamed through a share of a GPU's
residency budget (the offload's own budget): a resident part stays, the
rest is read in place or brought one submodule ahead, for inference and
training.

The per-submodule work (bring, wait, evict, write home) is the C++
executor's (csrc/torch/stream_executor.h), and what stays is core/
residency's policy; this file chooses the mode, installs the hooks that call
the executor, and puts the module back on undo. Backward, gradients and the
optimizer: offload_training.py."""
from __future__ import annotations

import collections
import functools
import sys
import types
import warnings
import weakref
from typing import Dict, List, Optional, Tuple, Union

import torch

from . import _C, clipping, offload_training, progress as _progress, trainers
from . import host_step as host_step_module
from . import checkpoint as _checkpoint
from .offload_state import OffloadState, window_bytes, window_units
from .offload_units import Unit, direct_tensors as _direct_tensors, make_units, offload_plan, \
    unit_roots
from .residency import cuda_device, end_lease, open_lease, span_bytes, get_residency_limit
from .host_memory import host_room
from .gpu_memory import ProcessBound
from .sizes import bytes_or_fraction


MODES = ("auto", "in_place", "prefetch")
# Inputs of at most this many rows (tokens) read streamed weights in place:
# a GEMM of 16 or 128 rows reads a weight in host memory as fast as a pinned
# copy of it, one of 1024 rows 4x slower (benchmarks/results/2026-11-23-h100/mechanisms.md).
IN_PLACE_MAX_ROWS = 128
# Kernels read host memory in place at about 49 GB/s where copy engines
# move it at 55 (FINDINGS.md): in place moves a byte at this share of the
# link's speed. For such inputs "auto" weighs it against prefetch's window.
IN_PLACE_SPEED = 0.9
def _rows(obj) -> int:
    """The most rows (tokens) among the tensors in a module's inputs: an
    integer tensor's elements (ids, each becomes a row), a float tensor's
    elements over its last dimension."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0:
            return 1
        if obj.is_floating_point() or obj.is_complex():
            return obj.numel() // max(obj.shape[-1], 1)
        return obj.numel()
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return max((_rows(o) for o in obj), default=0)
    return 0


def faster_mode(in_place_bytes: int, prefetch_bytes: int) -> str:
    """For small inputs without grad: the mode whose streamed bytes cross
    sooner. In place keeps the whole budget resident and reads the rest at
    IN_PLACE_SPEED of the link; prefetch copies at the link's speed, but its
    window takes budget, so more bytes stream. Large submodules (a window of
    two is a large share of the budget) read in place; small ones prefetch."""
    return "prefetch" if prefetch_bytes * IN_PLACE_SPEED < in_place_bytes else "in_place"


# The offloads not undone (an optimizer over two of them is refused by name).
_LIVE: "weakref.WeakSet[Offloaded]" = weakref.WeakSet()


# Autocast keeps the low-precision cast of each fp32 weight it meets (a leaf
# that requires grad) until its region ends: of an offloaded module, a copy
# of every weight in GPU memory beside the budget (5.6 GiB for a 3B model
# under bf16 autocast, held to the end of forward). While the offloaded
# module runs, the cache is off, so each cast lives as long as its use;
# after the forward, an exception's included, it is as the user had it.
def _cast_cache_off(handle: "Offloaded") -> None:
    handle._cast_cache_was.append(torch.is_autocast_cache_enabled())
    torch.set_autocast_cache_enabled(False)


def _cast_cache_back(handle: "Offloaded") -> None:
    if handle._cast_cache_was:
        torch.set_autocast_cache_enabled(handle._cast_cache_was.pop())


class Offloaded:
    """What :func:`offload` did to a module; :meth:`undo` reverses it. Its
    forward hooks are its methods; its state (settings, units, executor,
    optimizers, passes) is one OffloadState (offload_state.py), which
    backward, the streamed optimizer and the host's steps take too."""

    def __init__(self, state: OffloadState, originals, lease):
        self.state = state
        self._cast_cache_was: List[bool] = []   # the autocast cache's setting before each forward
        self._originals = originals
        self._lease = lease
        # dropped without undo: its share is given back when it is collected
        self._finalizer = weakref.finalize(self, end_lease, lease)
        self._finalizer.atexit = False
        self._final_stats = None             # residency_stats() when undone
        # the ids of every tensor it streams and of those they replaced (it
        # holds them all, so no id is reused while it lives)
        self._tensor_ids = {id(t) for u in state.units for t in u.targets} | state.replaced_ids

    # The offload as its user sees it (read only: the state's).
    module = property(lambda self: self.state.module, doc="The offloaded module.")
    device = property(lambda self: self.state.device, doc="The GPU it streams to.")
    budget = property(lambda self: self.state.budget, doc="Its budget, in bytes.")
    ahead = property(lambda self: self.state.ahead, doc="Submodules brought ahead.")
    mode = property(lambda self: self.state.mode,
                    doc='"in_place" or "prefetch" ("auto" until the first forward chose).')
    units = property(lambda self: self.state.units, doc="What streams as one (offload_units.py).")
    executor = property(lambda self: self.state.executor,
                        doc="The C++ executor, made by the first forward.")
    training = property(lambda self: self.state.training,
                        doc="Planned for training (a forward built a graph).")
    step_in_backward = property(lambda self: self.state.step_in_backward)
    host_step = property(lambda self: self.state.host_step,
                         doc="The share of the streamed units that step on the host.")
    learned = property(lambda self: self.state.learned,
                       doc="Whether the first forward ran and the plan is made.")

    def resident_units(self) -> List[Unit]:
        """The submodules that stay on the GPU (after the first forward)."""
        return self.state.resident_units()

    def holds_any(self, tensors) -> bool:
        """Whether any of `tensors` is this offload's: one it streams, or
        one of the module's that it replaced (undo() gives it back)."""
        return any(id(t) in self._tensor_ids for t in tensors)

    def stepped_in_backward(self, params) -> List[str]:
        """The names of the submodules among `params`' whose gradients
        stepped in this backward (step_in_backward), gone until the next."""
        return self.state.stepped_in_backward(params)

    def host_step_stats(self) -> dict:
        """stream_optimizer's host_step so far: ``units`` stepped on the
        host, ``step_seconds`` its fused AdamW took, ``wait_seconds`` the
        caller spent waiting for it (what the host added to the step),
        ``copy_wait_seconds`` the backward spent waiting for gradients'
        copies home."""
        return self.state.host_steps.stats()

    def host_stepped_units(self) -> List[Unit]:
        """The submodules whose weights step on the host now
        (stream_optimizer's host_step), the last in the forward's order
        first; none before the first forward plans."""
        return host_step_module.choose(self.state)

    def units_in_order(self) -> List[Unit]:
        """The submodules in the order the first forward ran them."""
        return self.state.units_in_order()

    def wait_for_host_steps(self) -> None:
        """Every step the host was given is done (with
        ``stream_optimizer(non_blocking=True)``, before reading or writing
        the offloaded weights or the optimizer's states other than by a forward,
        a ``state_dict`` or a ``load_state_dict``)."""
        self.state.host_steps.wait()

    def forward_rank(self, unit: Unit) -> int:
        """The unit's place in the order the first forward ran them."""
        return self.state.forward_rank(unit)

    def bytes_on_gpu(self) -> int:
        """The bytes of the module's weights in GPU memory now."""
        return 0 if self.state.executor is None else \
            sum(self.state.executor.bytes_on_gpu(u.index) for u in self.state.units)

    def residency_stats(self) -> Dict[str, int]:
        """This offload's share: its budget, bytes resident (current and
        peak), bytes brought, and evictions by how they left (after undo(),
        as they were then)."""
        if self._final_stats is not None:
            return dict(self._final_stats)
        return dict(_C.residency_budget().share_stats(self._lease.share))

    def least_budget(self, training: bool = True) -> int:
        """The smallest budget this module streams in: `ahead + 1` of its
        largest submodule, and, training, a step of its largest trainable
        part (its weights, gradients and two states)."""
        return self.state.least_budget(training)

    def _begin(self, args, kwargs) -> None:
        """Before each forward; before the first, choose how its weights
        stream. A forward that builds a graph follows requires_grad (what
        is trainable now), and, once an optimizer is streamed, plans again
        for training where the plan was for inference (an evaluation ran
        first) or made no room for a step as large as the trainable parts
        now need (parameters unfrozen). A forward without an optimizer
        (inference without no_grad) keeps its plan."""
        state = self.state
        training = torch.is_grad_enabled()
        if training:
            offload_training.follow_trainable(state)
        # host steps not yet waited for (no optimizer.step() since, or a
        # non_blocking one: then each unit's forward waits for its own)
        state.host_steps.before_forward()
        executor = state.executor
        if executor is not None:
            offload_training.end_failed_backward(state)
            executor.end_pass()   # what an interrupted pass left held
            if training and state.optimizers and (
                    not state.training or executor.largest_trainable() > state.planned_step):
                state.host_steps.wait()
                self._plan_for_training()
            return
        state.training = training
        in_place = state.mode == "in_place"
        if state.mode == "auto":
            in_place = not training and _rows((args, kwargs)) <= IN_PLACE_MAX_ROWS
            state.choose = in_place   # the first forward reads in place; "auto" chooses after it
        executor = _C.StreamExecutor(self._lease.share, state.device, state.ahead, in_place,
                                     state.training)
        for u in state.units:
            u.index = executor.add_unit(u.name, u.targets, u.trainable, u.buffers)
        state.executor = self._lease.executor = executor

    def _plan_for_training(self) -> None:
        """Everything leaves the GPU (written data goes home) and the plan is
        made again, for training, from the order the forwards ran in; or a
        clear refusal, before anything changes, if the budget cannot hold a
        step."""
        state = self.state
        need = state.least_budget(training=True)
        if need > state.budget:
            raise ValueError(
                f"torch_uvm: a budget of {state.budget} bytes cannot train this module: "
                f"{offload_training.why_budget(state, need)}")
        state.training = True
        state.choose = False
        if state.asked == "auto":
            state.mode = "prefetch"
        executor = state.executor
        planned = executor.planned()
        executor.evict_all()
        executor.set_training(True)
        executor.set_in_place(state.mode == "in_place")
        if planned:
            self._plan()

    def _plan(self) -> None:
        state = self.state
        state.executor.plan(*window_units(state.mode, state.training, state.ahead))
        state.planned_step = state.executor.largest_trainable()
        state.ranks = None

    def _pre(self, unit: Unit, args) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"torch_uvm: the offloaded module '{unit.name}' ran inside a CUDA "
                               "graph capture; streamed weights cannot be captured. Undo the "
                               "offload (or give it a budget that holds the whole model) first.")
        state = self.state
        if state.executor is None:      # a submodule called on its own first
            self._begin(args, {})
        elif state.host_steps.pending:  # (non_blocking: its own step; else every one, unless
            # a backward recomputes this forward, or it is called on its own before step())
            state.host_steps.before_forward(unit.index, recomputed=state.lifecycle.backward_active())
        state.executor.before(unit.index, False)

    def _post(self, unit: Unit, output=None) -> None:
        if self.state.executor is None:
            return
        self.state.executor.after(unit.index)
        offload_training.after_forward(self.state, unit, output)

    def _end_forward(self) -> None:
        state = self.state
        executor = state.executor
        if executor is None:
            return
        if not executor.planned():
            if state.choose:   # the first forward's order gives what each would stream
                state.mode = faster_mode(
                    executor.streamed_per_pass(*window_units("in_place", False, state.ahead)),
                    executor.streamed_per_pass(*window_units("prefetch", False, state.ahead)))
                executor.set_in_place(state.mode == "in_place")
                state.choose = False
            elif state.mode == "auto":
                state.mode = "prefetch"
            self._plan()
        executor.end_pass()

    def stream_optimizer(self, optimizer: torch.optim.Optimizer,
                         step_in_backward: bool = False,
                         host_step: float = 0.0,
                         non_blocking: bool = False) -> torch.optim.Optimizer:
        """Make `optimizer.step()` step one submodule at a time within the
        budget: its weights, gradients and states are brought to the GPU,
        the optimizer's own step runs on them, and what it wrote goes home
        (offload_training.py). Create the optimizer after offload. Returns it,
        still a ``torch.optim.Optimizer`` in every way trainers use one:
        ``step(closure)`` runs the closure (forward and backward) and returns
        its loss, ``zero_grad``, ``state_dict`` and ``load_state_dict`` (the
        loaded states go to their homes, never all to the GPU at once),
        ``add_param_group`` and schedulers editing ``param_groups``.

        `step_in_backward`: each submodule steps during backward, as soon as
        its gradients are complete, and its gradients are then set to None:
        they never leave the GPU (the fastest way; PyTorch's
        optimizer-in-backward). ``optimizer.step()`` then only finishes what
        backward did not step. Gradients are not there after backward (no
        clipping by global norm: ``torch.nn.utils.clip_grad_norm_`` and
        ``clip_grad_value_`` of them raise, clipping.py; no accumulation
        over several backwards: use the default for those). Not with data
        parallelism (DDP): a submodule would step on this rank's own
        gradients before they are averaged; a warning says so.

        `host_step`: the share (0 to 1) of the streamed submodules'
        trainable bytes that step on the host, the last in the forward's
        order first (host_step.py): their gradients go home, PyTorch's fused
        CPU Adam/AdamW steps their weights in their homes while the GPU runs
        the rest, and their moments never cross the link. For Adam and
        AdamW; the link then moves 12 bytes a fp32 parameter for them where
        a step on the GPU moves 28, and the host's step takes its time
        beside the GPU's: the best share makes the two take as long (the
        benchmarks' ``least_step_s`` finds it for a host and link).
        ``optimizer.step()`` returns with every weight stepped.

        `non_blocking` (with `host_step`): ``optimizer.step()`` returns
        before the host's steps end; each submodule's next forward waits for
        its own step, and the host steps the rest meanwhile (it takes first
        what the forward needs first). The host-stepped parameters'
        gradients are None after ``step()`` (the host holds them until its
        step). The optimizer's and the module's (or a part's)
        ``state_dict`` and ``load_state_dict``, and ``undo()``, wait for
        every step; code that reads or writes the offloaded parameters or
        the optimizer's states in another way before the next forward calls
        ``handle.wait_for_host_steps()`` first. Every optimizer of one
        offload takes the same `non_blocking`."""
        state = self.state
        offload_training.check_optimizer(
            state, optimizer, [h.state for h in list(_LIVE) if h is not self])
        share = host_step_module.check(optimizer, host_step)
        host_step_module.check_non_blocking(non_blocking, share or state.host_step,
                                            state.host_steps.non_blocking if state.optimizers
                                            else None)
        if share and state.host_step and share != state.host_step:
            raise ValueError(
                f"torch_uvm: this offload steps {state.host_step} of its streamed submodules on "
                f"the host for another optimizer; every optimizer of one offload takes the same "
                f"host_step (got {host_step})")
        for other in [o for o, _ in state.optimizers] + [optimizer]:   # it steps them all
            host_step_module.check(other, share or state.host_step)
        if step_in_backward and torch.distributed.is_available() and \
                torch.distributed.is_initialized():
            warnings.warn(
                "torch_uvm: stream_optimizer(step_in_backward=True) with torch.distributed "
                "initialized: each submodule steps during backward on this rank's own "
                "gradients, before DistributedDataParallel averages them, so the replicas "
                "drift apart. With DDP use step_in_backward=False (the default)", stacklevel=2)
        own = optimizer.step
        state.optimizers.append((optimizer, own))
        state.step_in_backward = bool(step_in_backward)
        if state.step_in_backward:      # PyTorch's clipping of its gradients raises
            clipping.watch(state)
        state.host_step = share or state.host_step
        if share:
            state.host_steps.copies_share = host_step_module.copies_share()   # (check() read it)
            if state.bound is not None:    # (the copies sit beside the slots, in the bound)
                state.host_steps.copies_cap = state.bound.copies_room
        if non_blocking and not state.host_steps.non_blocking:
            state.host_steps.non_blocking = True
            # a state_dict of the module, or of any part of it, reads the
            # homes, and a load_state_dict writes them: every host step first
            ref = weakref.ref(state)     # (the modules hold their hooks)

            def settled(*_):
                alive = ref()
                if alive is not None:
                    alive.host_steps.wait()
            for m in {id(u.module): u.module for u in state.units}.values():
                state.hooks.append(m.register_state_dict_pre_hook(settled))
                state.hooks.append(m.register_load_state_dict_pre_hook(settled))
        offload_training.keep_states_home(state, optimizer)
        # a method, as LR schedulers expect of optimizer.step
        optimizer.step = types.MethodType(
            lambda opt, closure=None, **kwargs: self._step(opt, own, closure, kwargs), optimizer)
        return optimizer

    @property
    def bound(self):
        """The bound on the process's GPU memory it was offloaded within
        (gpu_memory.ProcessBound: its ``budget``, ``plan``, ``describe()``),
        or None when it was given a budget."""
        return self.state.bound

    @property
    def offloaded(self) -> bool:
        """Whether the module is still offloaded: False after undo(), or
        after a ``.cpu()`` of it (which undoes it, as Lightning's teardown does)."""
        return getattr(self.state.module, "_torch_uvm_offloaded", None) is self

    def streams(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this offload streams `optimizer` (stream_optimizer)."""
        return self.state.streams(optimizer)

    def rebind_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """An optimizer made over the module's parameters before offload
        replaced them (``fabric.setup(model, optimizer)`` hands one over):
        its param groups name the offload's parameters instead, in place,
        so :meth:`stream_optimizer` takes it. Refused, before anything
        changes: one that holds state for the replaced parameters (it has
        stepped, or made its state when made, as Adagrad does), and one
        that would then hold a parameter twice. Others' parameters stay.
        Returns it."""
        if not self.offloaded:
            raise ValueError("torch_uvm: rebind_optimizer of an offload undone: offload the "
                             "module again first")
        now = {id(o): m._parameters[name] for (m, name, kind), o in self._originals.items()
               if kind == "param"}
        held = sum(1 for p in optimizer.state if id(p) in now)
        if held:
            raise ValueError(
                f"torch_uvm: the optimizer holds state for {held} of the parameters offload "
                f"replaced (it stepped before offload, or made its state when made): create "
                f"the optimizer after torch_uvm.offload, or load the old one's state_dict() "
                f"into it")
        groups = [[now.get(id(p), p) for p in g["params"]] for g in optimizer.param_groups]
        flat = [id(p) for g in groups for p in g]
        if len(flat) != len(set(flat)):
            raise ValueError(
                "torch_uvm: the optimizer holds both a parameter offload replaced and its "
                "replacement, so it would hold one parameter twice: create the optimizer "
                "after torch_uvm.offload, from module.parameters()")
        for group, params in zip(optimizer.param_groups, groups):
            group["params"] = params
        return optimizer

    def stream_trainer(self, trainer, step_in_backward: bool = False, host_step: float = 0.0,
                       non_blocking: bool = False):
        """Make a Hugging Face ``Trainer`` (or a subclass) stream the
        optimizer it makes from its ``TrainingArguments``, as
        :meth:`stream_optimizer` with these settings would (trainers.py).
        Offload the model before making the Trainer. Returns `trainer`."""
        return trainers.stream_trainer(self, trainer, step_in_backward=step_in_backward,
                                       host_step=host_step, non_blocking=non_blocking)

    def _step(self, optimizer, own, closure, kwargs):
        offload_training.check_params(self.state, optimizer,
                                      [h.state for h in list(_LIVE) if h is not self])
        loss = None
        if closure is not None:
            loss = offload_training.run_closure(self.state, closure)
        offload_training.step(self.state, optimizer, own, kwargs)
        return loss

    def undo(self) -> None:
        """Stop streaming: hooks removed, parameters and buffers back to the
        tensors they were (their values, and whether they require grad,
        included); what was on the GPU went home first, and the share of the
        budget is given back. The tensors that were on the CPU read their
        values in the homes, pinned host memory, with no copy (those built
        on the meta device are replaced by CPU tensors over their homes);
        those that were on the GPU are copied there (if they do not fit, a
        torch.OutOfMemoryError says so and the module stays offloaded).
        Undone already: nothing more."""
        self._undo(to_cpu=False)

    def _undo(self, to_cpu: bool) -> None:
        """undo(); `to_cpu`: every tensor back on the CPU (module.cpu())."""
        if self._final_stats is not None:
            return
        state = self.state
        if state.bound is not None:
            state.bound.close()
        state.host_steps.wait()               # the homes are written no more
        if state.executor is not None:
            state.executor.evict_all()
            state.executor.end_pass()
        torch.cuda.synchronize(state.device)  # the homes are read below
        values, states = self._values_back(to_cpu)   # may fail: nothing undone yet
        self._final_stats = self.residency_stats()
        for h in state.hooks:
            h.remove()
        for u in state.units:
            for m in u.members:
                m.__dict__.pop("_apply", None)
        _LIVE.discard(self)
        _C.release_cached_slots()             # the slots' device memory goes back
        self._finalizer.detach()
        end_lease(self._lease)
        # One that never had values (on the meta device, its values read from
        # a checkpoint) cannot take them: a new tensor over its home stands in.
        standins: Dict[int, torch.Tensor] = {}
        for (_, _, kind), original in self._originals.items():
            if original.is_meta and id(original) in values:
                v = values.pop(id(original))
                standins[id(original)] = torch.nn.Parameter(v) if kind == "param" else v
        done = set(standins)                  # (a tied tensor is put back once)
        back: Dict[int, torch.Tensor] = {}    # each parameter streamed -> the one put back
        with torch.no_grad():
            for (owner, name, kind), original in self._originals.items():
                current = getattr(owner, name)
                if id(original) in values:
                    original.data = values.pop(id(original))
                elif id(original) not in done:
                    original.copy_(current)       # it kept its memory: views see it
                done.add(id(original))
                original = standins.get(id(original), original)
                if kind == "param":
                    original.requires_grad_(current.requires_grad)
                    owner._parameters[name] = original
                    back[id(current)] = original
                else:
                    owner._buffers[name] = original
        offload_training.hand_back(state, back, states)   # the optimizers step the module's
        offload_training.forget(state)
        state.executor = self._lease.executor = None
        del state.module._torch_uvm_offloaded

    def _values_back(self, to_cpu: bool):
        """Each original's value where it goes back: on the CPU, over its
        home (no copy); on a GPU, a copy, all made before any is put back.
        And so the states its streamed optimizers keep of it
        (offload_training.states_back)."""
        values: Dict[int, torch.Tensor] = {}
        devices: Dict[int, torch.device] = {}   # each streamed parameter -> where it goes
        states = {}
        gpu_bytes = 0
        try:
            with torch.no_grad():
                for (owner, name, kind), original in self._originals.items():
                    current = getattr(owner, name).detach()
                    device = torch.device("cpu") if to_cpu or original.is_meta \
                        else original.device
                    if kind == "param":
                        devices[id(getattr(owner, name))] = device
                    if id(original) in values or _kept_memory(original, to_cpu):
                        continue
                    if device.type == "cpu":
                        values[id(original)] = _on_cpu_without_copy(current)
                    else:
                        gpu_bytes += current.nbytes
                        values[id(original)] = current.to(device, copy=True)
                states = offload_training.states_back(self.state, devices)
        except torch.OutOfMemoryError as e:
            values.clear()                    # (a traceback kept would hold them)
            states = {}
            raise torch.OutOfMemoryError(
                f"torch_uvm: undo() puts the module's tensors back on the GPU they came from, "
                f"and they do not fit there now (out of memory after {gpu_bytes} bytes). The "
                f"module is still offloaded: free GPU memory and call undo() again, or move "
                f"it to the CPU (module.cpu() undoes the offload there). {e}") from None
        return values, states


def _kept_memory(original: torch.Tensor, to_cpu: bool) -> bool:
    """Whether `original` kept its memory through the offload (something
    else held it), so that undo() copies its value back in place: views,
    state_dict()'s tensors and other holders see it, and nothing new is
    allocated. Not when module.cpu() asks for a GPU tensor on the CPU, nor
    where copy_ cannot write (an inference tensor; an expanded one, whose
    elements share memory): those get new memory as emptied ones do."""
    return (original.numel() > 0 and not original.is_meta
            and not (to_cpu and original.device.type != "cpu")
            and not original.is_inference()
            and torch._debug_has_internal_overlap(original) == 0)


def _on_cpu_without_copy(t: torch.Tensor) -> torch.Tensor:
    """`t`'s value on the CPU: over its home where it has one (a streamed
    tensor at home, or a home no streamed tensor took over), else a copy."""
    if t.device.type == "cpu":
        return t
    if t.numel() > 0:
        seen = _C.home_on_cpu(t)
        if seen is not None:
            return seen
        if _C.is_pinned_home(t):
            return _C.fresh_home_on_cpu(t)
    return t.to("cpu", copy=True)


def hook_forward(handle: Offloaded) -> None:
    """The forward hooks of an offload: the module's (its forward's begin
    and end, the autocast cache around it) and each unit's (before and
    after it runs), kept in its state's hooks for undo() to remove."""
    state = handle.state
    module, hooks = state.module, state.hooks
    bound = state.bound
    if bound is not None:     # first: a forward it refuses changes nothing
        hooks.append(module.register_forward_pre_hook(
            lambda _m, args, kwargs: bound.check(args, kwargs), with_kwargs=True))
        hooks.append(module.register_forward_pre_hook(lambda _m, _a: bound.begin_forward()))
        hooks.append(module.register_forward_hook(lambda _m, _a, _o: bound.end_forward(),
                                                  always_call=True))
    hooks.append(module.register_forward_pre_hook(lambda _m, _a: _cast_cache_off(handle)))
    hooks.append(module.register_forward_pre_hook(
        lambda _m, args, kwargs: handle._begin(args, kwargs), with_kwargs=True))
    for u in state.units:
        hooks.append(u.module.register_forward_pre_hook(lambda _m, a, u=u: handle._pre(u, a)))
        hooks.append(u.module.register_forward_hook(
            lambda _m, _a, out, u=u: handle._post(u, out)))
    hooks.append(module.register_forward_hook(lambda _m, _a, _o: handle._end_forward()))
    hooks.append(module.register_forward_hook(lambda _m, _a, _o: _cast_cache_back(handle),
                                              always_call=True))


def _guard_conversions(handle: Offloaded, unit: Unit, member: torch.nn.Module) -> None:
    """``module.cpu()`` / ``.to("cpu")`` of an offloaded module (Lightning
    does it at the end of fit) undoes the offload first: its tensors are
    then the module's own again, and move as usual. A conversion to another
    dtype or GPU is refused by name (the offload's tensors are where they
    stream); moves that change nothing (``.cuda()``, ``.to(device)``) pass.
    On each member of each unit (the modules whose own tensors it holds)."""
    probe_of = unit.targets[0] if unit.targets else None
    own = member._apply

    def _apply(fn, *args, **kwargs):
        if probe_of is not None and getattr(handle.module, "_torch_uvm_offloaded", None) is handle:
            probe = fn(torch.empty(0, device=probe_of.device, dtype=probe_of.dtype))
            if probe.device.type == "cpu" and probe.dtype == probe_of.dtype:
                handle._undo(to_cpu=True)   # the module's own tensors again, on the CPU
            elif any(fn(t) is not t for t in unit.targets):   # (a move that changes nothing
                raise RuntimeError(                            # returns the tensor itself)
                    f"torch_uvm: '{unit.name}' is offloaded to {handle.device} as "
                    f"{probe_of.dtype}; converting it (to {probe.device} as {probe.dtype}, or "
                    "to another memory format) is not done in place. undo() the offload, "
                    "convert the module, and offload it again")
        return own(fn, *args, **kwargs)
    member._apply = _apply


# Managed CPU memory the originals free goes to torch_uvm's cache, not back
# to the host: offload returns it (empty_cache) each time this much is free,
# so the homes and the weights they replace overlap by at most this.
RELEASE_EVERY = 1 << 30


def _make_replacements(plan, held: set, shared: Dict[int, torch.Tensor],
                       device: torch.device, found: Dict[int, "_checkpoint.Entry"],
                       shown: "_progress.Progress") -> None:
    """Phase 1 of offload: each tensor's replacement in `shared`, over a new
    home, its value the tensor's own or, where `found` has an entry for it,
    the checkpoint's (read straight into the home, on reader threads); a CPU
    tensor that only the module holds, of the same value, reads that home
    from then on, and its own memory goes (to the host: managed memory is
    given back as it frees)."""
    reader = _checkpoint.Reader() if found else None
    freed, failed = 0, False
    try:
        with torch.no_grad():
            for _, _, own, _ in plan:
                for _, t, kind in own:
                    if id(t) in shared:
                        continue
                    if t.numel() == 0:          # no memory to manage: it just moves
                        seen = torch.empty(t.shape, dtype=t.dtype, device=device) \
                            if t.is_meta else t.detach().to(device)
                    elif id(t) in found:
                        seen = _C.empty_pinned_home(t.detach(), device)
                        reader.submit(found[id(t)], _C.fresh_home_on_cpu(seen), shown.update)
                    else:
                        seen = _home_for(t, device)
                        shown.update(t.numel() * t.element_size())
                    # (one the checkpoint gives a value keeps its own until
                    # phase 2: a failure here must leave the module unchanged)
                    if t.numel() > 0 and t.device.type == "cpu" and id(t) not in held \
                            and id(t) not in found:
                        if _C.is_managed(t):
                            freed += span_bytes(t)
                        t.data = _C.fresh_home_on_cpu(seen)
                        if freed >= RELEASE_EVERY:
                            _C.empty_cache()
                            freed = 0
                    if kind == "param":
                        seen = torch.nn.Parameter(seen, requires_grad=t.requires_grad)
                    shared[id(t)] = seen
    except BaseException:
        failed = True
        raise
    finally:
        try:
            if reader is not None:              # every read done before a home may go
                reader.close(failed)
        finally:
            if freed:
                _C.empty_cache()


def _refuse_nested(module: torch.nn.Module) -> None:
    """An offload streams its tensors alone: a module sharing one with an
    offload not undone (a part of its module, a parent of it, a module
    holding one of its parameters) is refused, naming that offload."""
    for other in list(_LIVE):
        names = [f"{name}.{tname}" if name else tname for name, m in module.named_modules()
                 for tname, t, _ in _direct_tensors(m) if other.holds_any([t])]
        if not names:
            continue
        held = type(other.module).__name__
        how = ("is a part of" if any(m is module for m in other.module.modules()) else
               "holds" if any(m is other.module for m in module.modules()) else
               "shares tensors with")
        raise RuntimeError(
            f"torch_uvm: {type(module).__name__} {how} the offloaded {held} "
            f"({', '.join(names[:3])}{' ...' if len(names) > 3 else ''} "
            f"{'is' if len(names) == 1 else 'are'} streamed by that offload, budget "
            f"{other.budget} bytes): one tensor streams in one offload. Call undo() on the "
            f"handle offload({held}) returned first, then offload the module you want; "
            f"nothing was changed")


@functools.lru_cache(maxsize=None)
def _cxx_references_counted() -> bool:
    """Whether what PyTorch holds in C++ (a view's base, autograd's saved
    tensors) shows in a tensor's Python reference count, as in recent
    PyTorch. Where it does not, held_elsewhere cannot see those holders and
    says every tensor is held: the offload keeps their memory."""
    t = torch.zeros(1)
    before = sys.getrefcount(t)
    view = t.view(1)
    counted = sys.getrefcount(t) > before
    del view
    return counted


def _largest_unit(plan, roots, tensors) -> Tuple[str, int]:
    """The name and bytes of the largest unit offload would make. No unit
    outlives this call: its tensors' references would count as holders in
    held_elsewhere, and their memory would stay beside their homes."""
    largest = max(make_units(plan, roots, tensors), key=lambda u: u.nbytes)
    return largest.name, largest.nbytes


def held_elsewhere(tensors: Dict[int, torch.Tensor], plan) -> set:
    """The ids of `tensors` that something besides the module holds: a
    module outside it tied to one, a user's variable, an autograd graph, a
    view or a detached alias of its storage (state_dict()'s). Those keep
    their own memory through an offload, and undo() copies their values
    back into it. Counted by reference (the tensor's and its storage's):
    the module's dictionaries and `plan` hold each once per place it has in
    the module, and `tensors` once; a probe held the same way measures what
    this count itself adds."""
    if not _cxx_references_counted():
        return set(tensors)
    places = collections.Counter(id(t) for _, _, own, _ in plan for _, t, _ in own)

    def beyond(obj, known: int) -> int:
        return sys.getrefcount(obj) - known
    probes = {0: object()}                 # iterated as `tensors` is, below
    base = [beyond(p, 1) for _, p in probes.items()][0]
    alone = _storage_users(torch.zeros(1))
    return {i for i, t in tensors.items()
            if beyond(t, 2 * places[i] + 1) > base or _storage_users(t) != alone}


def _storage_users(t: torch.Tensor) -> int:
    """How many hold `t`'s storage: a view, a detached alias (state_dict()'s
    tensors), a saved tensor shares it beside `t` itself."""
    try:
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata)
    except (RuntimeError, AttributeError, NotImplementedError):
        return -1                          # (unknown: held)


def _check_host_room(module: torch.nn.Module, tensors: Dict[int, torch.Tensor],
                     held: set, found: Dict[int, "_checkpoint.Entry"]) -> None:
    """Refuses, before any is pinned, homes the host cannot hold: their bytes
    against the memory available, plus what the module's CPU tensors give
    back as each moves into its home (not those held elsewhere, nor those a
    checkpoint gives values, which give theirs back after; managed ones too,
    which _make_replacements returns to the host)."""
    need = sum(t.numel() * t.element_size() for t in tensors.values())
    given_back = sum(t.numel() * t.element_size() for i, t in tensors.items()
                     if i not in held and i not in found and t.device.type == "cpu")
    room = host_room()
    if room is not None and need > room[0] + given_back:
        raise torch.OutOfMemoryError(
            f"torch_uvm: offloading {type(module).__name__} needs {need} bytes of pinned host "
            f"memory for its homes, and the host has {room[0]} bytes available ({room[1]}), "
            f"with {given_back} more given back by its CPU tensors as they move there. Free "
            f"host memory, or offload a smaller module; it is unchanged")


def _home_for(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t`'s value in its home: pinned host memory, seen on `device` (a CUDA
    tensor owning all of it; csrc/torch/pinned_home.h)."""
    return _C.pinned_home(t.detach(), device)


def offload(module: torch.nn.Module, budget: Union[int, str, None] = None, device=None,
            ahead: int = 1, mode: str = "auto", checkpoint=None, units=None,
            progress=None, gpu_memory=None, batch: Optional[int] = None,
            seq: Optional[int] = None, inputs=None) -> Offloaded:
    """Run `module` on `device` with at most `budget` bytes of its weights
    in GPU memory (an int, or a size such as ``"20GiB"``: sizes.py; a float
    in (0, 1]: that fraction of the device's residency limit, or of the
    managed memory cap without one; default: the device's residency limit).

    The budget is this module's own share of the GPU: several offloaded
    modules each stream within theirs, and their budgets add up to at most
    the device's residency limit (or, without one, the managed memory cap);
    a budget that does not fit beside the others is refused, naming them.

    Parameters and buffers become tensors on `device` whose home is pinned
    host memory, mapped for the GPU (the module's tensors are replaced; their
    values are kept). The first forward learns the order in which submodules run;
    after it, the longest run of that order that fits the budget (less the
    window streaming needs, sized by the largest submodule that streams)
    stays on the GPU: for inference its end, so that the streamed
    submodules' kernels, which wait on the link, queue first and the
    resident rest runs while the next pass's first weights arrive; for
    training its start, where backward ends. The rest streams:
    while submodule i runs, the next `ahead` are copied to GPU memory on a
    side stream, and the least recently used leave (written ones are copied
    home). Training copies more, beyond those, into budget room nothing
    holds (a forward's empty room for the step), evicting nothing for them. For inference (``torch.no_grad()``, ``generate``) and training
    (see :meth:`Offloaded.stream_optimizer`).

    `mode` says how the streamed weights reach the kernels:
    ``"in_place"``: kernels read them in host memory over PCIe, with no GPU
    memory and no window (the whole budget stays resident); as fast as a
    copy for small batches. ``"prefetch"``: copied to the GPU `ahead`
    submodules early and let go after use. ``"auto"`` (default): when the
    first forward runs without grad on inputs of at most IN_PLACE_MAX_ROWS
    rows (tokens), whichever of the two moves its streamed bytes sooner
    (:func:`faster_mode`: in place reads at about 0.9 of the link's speed,
    prefetch's window takes budget), chosen after that forward, which reads
    in place; else prefetch.

    `checkpoint`: safetensors weights (a file, a list of files, or a folder
    such as a Hugging Face model's) read straight into the homes: the
    module's tensors named in it take its values, and the module may be
    built without weights (on the meta device, or under accelerate's
    ``init_empty_weights``), so the host never holds the weights twice
    (checkpoint.py). Every tensor on the meta device must be in it; names
    and shapes are checked before anything is read.

    `units`: what streams as one (offload_units.py). By default each
    submodule with tensors of its own; given module classes, their names
    (a Hugging Face model's ``_no_split_modules``) or a function of a
    module, each module it matches streams whole, with everything below
    it: fewer, larger units, each brought `ahead` whole (a PEFT LoRA
    layer's adapters with its base weight; a decoder layer). The unit's
    forward must call its members. The least budget grows with the
    largest unit.
    `progress`: pinning the homes and reading a checkpoint show a progress
    bar on stderr when they move 1 GiB or more (None, the default; hidden
    by TORCH_UVM_QUIET=1), always (True) or never (False): progress.py.
    `gpu_memory`: instead of a budget, the most GPU memory the whole
    process may take (a size, a float: that fraction of the card, or
    "auto"), for a Hugging Face decoder-only model whose forwards run at
    most `batch` sequences of `seq` tokens (a generation's: the prompt's
    and the generated); for any other module, whose forwards run at most
    the shapes of `inputs` (its forward's arguments: a tensor, a tuple, or
    a dict by name; on any device: only their shapes are read). It
    measures what the process holds now and chooses
    the largest budget within it, up to the one that keeps every weight
    resident (the weights, and training a step's room), refuses (naming the least that fits and
    what takes it) before anything is pinned when none fits, and refuses
    any later forward that would pass it before it runs (gpu_memory.py).
    Returns a handle whose ``undo()`` puts the module back."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"offload expects a torch.nn.Module, got {type(module).__name__}")
    if getattr(module, "_torch_uvm_offloaded", None) is not None:
        raise RuntimeError("torch_uvm: this module is already offloaded; call undo() on the "
                           "handle offload returned before offloading it again")
    _refuse_nested(module)
    if not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 1:
        raise ValueError(f"ahead must be a positive int, got {ahead!r}")
    if mode not in MODES:
        raise ValueError(f"torch_uvm: offload mode must be one of {MODES}, got {mode!r}")
    _progress.check(progress)
    if gpu_memory is not None and budget is not None:
        raise ValueError("torch_uvm: offload takes a budget or gpu_memory, not both: "
                         "gpu_memory chooses the budget within it")
    if gpu_memory is None and (batch is not None or seq is not None or inputs is not None):
        raise ValueError("torch_uvm: offload's batch=, seq= and inputs= size gpu_memory's plan; "
                         "pass gpu_memory= with them (or none of them)")
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("torch_uvm: cannot offload a module during a CUDA graph capture")
    device = cuda_device(device)
    devices = {t.device for _, m in module.named_modules() for _, t, _ in _direct_tensors(m)}
    gpus = {d for d in devices if d.type == "cuda"}
    if len(gpus) > 1 or (gpus and next(iter(gpus)) != device):
        raise ValueError(f"torch_uvm: the module's tensors are on {sorted(map(str, devices))}; "
                         f"offload needs them on the CPU or on {device} alone. Move the module "
                         f"to one device first")
    bound = None
    if gpu_memory is not None:
        bound = ProcessBound.plan_for(module, gpu_memory, device, batch, seq, ahead, units,
                                      inputs)
        budget = bound.budget
    # (a fraction: of the GPU's residency limit, or of the managed memory cap)
    budget = bytes_or_fraction(budget, "budget",
                               lambda: get_residency_limit(device) or _C.memory_cap())
    if budget is None:
        budget = get_residency_limit(device)
        if budget is None:
            raise ValueError("torch_uvm: offload needs a budget: pass budget= (bytes) or set "
                             "torch_uvm.set_residency_limit for the device")
    if budget > _C.memory_cap():
        raise ValueError(f"a budget of {budget} bytes is above the managed memory cap "
                         f"({_C.memory_cap()} bytes)")
    plan = offload_plan(module)
    if not plan:
        raise ValueError("torch_uvm: the module has no parameters or buffers to offload")
    roots = unit_roots(module, units)
    tensors = {id(t): t for _, _, own, _ in plan for _, t, _ in own}   # tied ones once
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    show = _progress.shown(progress, total)     # (a bad TORCH_UVM_QUIET refused here)
    # (a checkpoint's match refuses meta tensors it lacks, by name)
    found = {} if checkpoint is None else _checkpoint.match(
        _checkpoint.read_checkpoint(checkpoint), _checkpoint.names_by_tensor(module), tensors)
    meta = [] if checkpoint is not None else [
        f"{name}.{tname}" if name else tname for name, m in module.named_modules()
        for tname, t, _ in _direct_tensors(m) if t.is_meta]
    if meta:
        raise ValueError(f"torch_uvm: offload needs the weights' values, and {', '.join(meta[:3])}"
                         f"{' ...' if len(meta) > 3 else ''} are on the meta device. Load them "
                         f"first (load_state_dict(..., assign=True) or to_empty + load), or "
                         f"pass their safetensors files as checkpoint=")
    largest_name, largest_bytes = _largest_unit(plan, roots, tensors)
    window = window_bytes("prefetch", False, ahead, largest_bytes)
    if budget < window and mode != "in_place":
        raise ValueError(f"torch_uvm: a budget of {budget} bytes cannot stream submodule "
                         f"'{largest_name}' ({largest_bytes} bytes): it needs at least {window} "
                         f"bytes (ahead + 1 = {ahead + 1} of the largest submodule). Raise "
                         f"the budget, lower ahead, {'stream smaller units, ' if units else ''}"
                         f"or read it in place (mode='in_place')")
    held = held_elsewhere(tensors, plan)
    _check_host_room(module, tensors, held, found)
    # Its own share of the GPU, or a clear refusal (nothing changed yet).
    lease = open_lease(device, budget, type(module).__name__)
    # Phase 1 makes every replacement and changes nothing the module's
    # users see, so a failure here (out of memory, say) leaves it as it
    # was. A tensor on the CPU reads its value in its new home from then
    # on, and its own memory goes: the host never holds the weights twice.
    shared: Dict[int, torch.Tensor] = {}     # id(tensor) -> its replacement: tied stay tied
    what = "torch_uvm: reading the checkpoint into pinned homes" if found else \
        "torch_uvm: pinning homes"
    try:
        with _progress.Progress(total, what, show) as shown:
            _make_replacements(plan, held, shared, device, found, shown)
    except BaseException:
        end_lease(lease)
        raise
    # Phase 2 puts them in: dictionary stores, which cannot fail half-way.
    originals = {}
    for name, m, own, _ in plan:
        for tname, t, kind in own:
            originals[(m, tname, kind)] = t
            (m._parameters if kind == "param" else m._buffers)[tname] = shared[id(t)]
    units = make_units(plan, roots, shared)
    # The tensors the module had keep no memory while it is offloaded (those
    # on the GPU give theirs back now); undo() gives them their values again.
    # One that something else holds keeps its own, as it was.
    freed = False
    for i, t in tensors.items():
        if t.numel() > 0 and i not in held:
            freed = freed or _C.is_managed(t)
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
    state = OffloadState(module, device, budget, ahead, mode, units,
                         host_step_module.HostSteps(device), {id(t) for t in originals.values()})
    state.bound = bound
    handle = Offloaded(state, originals, lease)
    hook_forward(handle)
    for u in units:
        for m in u.members:
            _guard_conversions(handle, u, m)
    offload_training.install(state)
    module._torch_uvm_offloaded = handle
    _LIVE.add(handle)
    # Managed memory goes to torch_uvm's cache as it frees: given back too
    # (the offload is done; a failure here only leaves it cached).
    if freed:
        try:
            _C.empty_cache()
        except RuntimeError as e:
            warnings.warn(f"torch_uvm: the managed memory the offload freed stays in "
                          f"torch_uvm's cache ({e}); torch_uvm.empty_cache() gives it back")
    return handle
