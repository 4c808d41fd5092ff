"""FSDP2 composed with torch_uvm (issue 57; design.md, "Beyond one GPU").
The user's code stays FSDP2's:

    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch_uvm.fsdp.step_in_backward(model, optimizer)
    ...
    loss.backward()          # each param group steps as its gradients complete
    optimizer.step()         # steps what did not, and ends the step
    optimizer.zero_grad()

A **param group** is the parameters one ``fully_shard`` call manages (those
of its module not managed by a nested one). Each is a unit of the core
lifecycle (csrc/core/unit_lifecycle.h), as an offloaded submodule is. Its
gradients are complete once FSDP2 has called the post-accumulate-grad hook
of each of its trainable sharded parameters, after their reduce-scatter.
Then it steps at once, while the backward goes on:
- the optimizer's own step, narrowed to its parameters;
- its gradients are then let go.

A group whose shards are on the CPU (FSDP2's ``CPUOffloadPolicy``, or a CPU
mesh) steps on one worker thread instead, on the rank's share of the host's
cores but two (``host_step.rank_threads()``): the backward goes on beside the
host's step, as FSDP2's own offload does not. It steps their local shards
(``on_local_shards``, narrowed_step.py): a step of DTensors keeps the GIL
through its kernel, and so stalls the backward's Python.
The worker waits for the GPU's work queued before the hook first (the
gradient's copy home among it). The next forward, before FSDP2 gathers
anything, ``optimizer.step()``, ``zero_grad()``, ``state_dict()``,
``load_state_dict()`` and ``add_param_group()`` wait for every queued step
(and raise its error, if one failed).

Accumulation is FSDP2's own: its gradient sync off for every micro-batch
but the last (``model.set_requires_gradient_sync(False)``), so nothing is
reduced, and nothing steps, until the last backward.

So, as under an offload's ``step_in_backward``:
- PyTorch's clipping of those parameters raises;
- a forward with gradients before ``optimizer.step()`` (accumulation)
  raises, before anything of it runs;
- so does ``step(closure)``.

Built so far: this step, tested on two CPU ranks (gloo): bit for bit as
FSDP2's own step after backward, with FSDP2's MixedPrecisionPolicy too, and
through a run saved with torch.distributed.checkpoint and resumed
(``get_state_dict`` initializes a fresh optimizer's states with one
``optimizer.step()``, which steps every group here), and the host's steps
on the worker. Not yet built: the shards in pinned homes that FSDP2's
copy-in reads in place. Not yet run on GPUs."""
from __future__ import annotations

import concurrent.futures
import threading
import time
import weakref
from typing import List, Tuple

import torch

from . import _C, clipping, host_step
from .narrowed_step import step_over


# torch.optim's optimizers whose step reads and writes each parameter alone
ELEMENTWISE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad,
               torch.optim.Adamax, torch.optim.RMSprop, torch.optim.NAdam, torch.optim.RAdam,
               torch.optim.Adadelta, torch.optim.Rprop)


def param_groups(model: torch.nn.Module) -> List[Tuple[str, List[torch.nn.Parameter]]]:
    """(module name, its parameters) of each ``fully_shard`` call within
    `model`, the innermost first; groups without parameters left out."""
    from torch.distributed.fsdp import FSDPModule
    owners = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    taken, groups = set(), []
    for name, m in reversed(owners):       # (pre-order reversed: nested ones first)
        params = [p for p in m.parameters() if id(p) not in taken]
        taken.update(id(p) for p in params)
        if params:
            groups.append((name or "(the root)", params))
    return groups


class ShardSteps:
    """What step_in_backward installed: the lifecycle of `model`'s param
    groups and the optimizer's step. ``undo()`` takes it out."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 groups: List[Tuple[str, List[torch.nn.Parameter]]], threads: int = 0):
        self.model, self.optimizer = model, optimizer
        self.threads = threads     # the host worker's (host_step.rank_threads()); 0: none
        # The worker steps each group's local shards (narrowed_step.py), the
        # GIL free while the kernel runs; False steps the DTensors, whose
        # dispatch keeps the GIL through the kernel and so stalls the
        # backward's Python hooks (design.md, "Beyond one GPU": measured).
        self.on_local_shards = True
        self._rank_threads = torch.get_num_threads()   # given back after each host step
        self.names = [n for n, _ in groups]
        self.params = [ps for _, ps in groups]
        self.lifecycle = _C.UnitLifecycle(self.names)
        self._own_step = optimizer.step
        self._events: List["torch.cuda.Event"] = []
        self._hooks = []
        # the groups on the CPU step on one worker, in the order they complete
        self._on_host = [all(p.device.type == "cpu" for p in ps) for ps in self.params]
        self._worker = None
        self._queued: List[concurrent.futures.Future] = []
        # what the host's steps took, and what the caller waited for them (stats())
        self._host_steps, self._host_seconds, self._waited_seconds = 0, 0.0, 0.0
        self._stepping = threading.Lock()     # one narrowed step, or one let go, at a time
        # the rank's GPU (set before fully_shard, as FSDP2 reads it): where a
        # gradient's copy home runs, which the host's step waits for
        self._device = torch.device("cuda", torch.cuda.current_device()) \
            if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self._count_expected()
        ref = weakref.ref(self)
        self._hooks.append(model.register_forward_pre_hook(
            lambda _m, _a: (lambda s: s and s.before_forward())(ref()), prepend=True))
        optimizer.step = self.step
        # what reads or changes the optimizer's gradients, states and groups:
        # after the worker's steps (which read the gradients and let them go,
        # narrow the groups, and may key states by local shards while they run)
        self._waits_first = {name: getattr(optimizer, name) for name in
                             ("zero_grad", "state_dict", "load_state_dict", "add_param_group")}
        for name, own in self._waits_first.items():
            setattr(optimizer, name, self._after_queued_steps(own))
        optimizer._torch_uvm_shard_steps = self
        clipping.watch(self)

    def _held(self) -> set:
        return {id(p) for g in self.optimizer.param_groups for p in g["params"]}

    def _count_expected(self) -> None:
        """Each group's gradients a backward brings: its parameters the
        optimizer holds that require grad now, each with FSDP2's
        post-accumulate hook. (FSDP2 reduces a group's gradients together,
        so a part thawed since steps with the group's others, and one
        frozen since leaves the group to step in optimizer.step().)"""
        held, ref = self._held(), weakref.ref(self)
        self._counted = {id(p) for ps in self.params for p in ps
                         if p.requires_grad and id(p) in held}
        for i, params in enumerate(self.params):
            self.lifecycle.set_expected(i, sum(1 for p in params if id(p) in self._counted))
            for p in params:
                if id(p) in self._counted:
                    self._hooks.append(p.register_post_accumulate_grad_hook(
                        lambda p, i=i: (lambda s: s and s.gradient(i, p))(ref())))

    def before_forward(self) -> None:
        """Before FSDP2's own pre-forward (prepended): a forward that will
        take gradients while groups stepped in the last backward and no
        optimizer.step() came since is refused here, before anything of
        it runs (its backward would step them twice). A backward that
        raised is ended here first: the groups that stepped in it keep
        their step."""
        if self.lifecycle.backward_active() and torch._C._current_graph_task_id() == -1:
            self.end_backward()
        self.wait()          # FSDP2's gathers read what the host's steps write
        if torch.is_grad_enabled() and self.lifecycle.stepped_in_backward():
            raise RuntimeError(
                "torch_uvm: a forward with gradients before optimizer.step(): its param "
                "groups stepped in the last backward already (fsdp.step_in_backward), so "
                "gradients cannot accumulate over backwards. Call optimizer.step() after each "
                "backward, or run this forward under torch.no_grad(); to accumulate, turn "
                "FSDP2's gradient sync off for every micro-batch but the last "
                "(model.set_requires_gradient_sync(False)): nothing steps until the last "
                "backward reduces")

    def gradient(self, unit: int, param: torch.Tensor) -> None:
        """One of the unit's reduced gradients is in (FSDP2's hook, in the
        backward): the backward opens at its first; the unit steps at its
        last. One the optimizer does not hold counts for nothing."""
        life = self.lifecycle
        if id(param) not in self._counted:
            return
        if not life.backward_active():
            opened, _ = life.backward_begins(unit, True)
            if opened:
                ref = weakref.ref(self)
                torch.autograd.Variable._execution_engine.queue_callback(
                    lambda: (lambda s: s and s.end_backward())(ref()))
        if life.gradient(unit, torch._C._current_graph_task_id()):
            life.steps_in_backward(unit)            # (refused if it stepped already)
            if self._on_host[unit]:
                self._submit(unit)
            else:
                self._step(unit)
                self._let_go(unit)
            life.stepped(unit, True)
            if self.params[unit][0].is_cuda:       # the next forward's gathers after it
                event = torch.cuda.Event()
                event.record()
                self._events.append(event)

    def _submit(self, unit: int) -> None:
        """The unit's step on the worker, after the work queued so far on the
        rank's current stream, where FSDP2 calls the hook: its post-reduce
        stream, which copied the gradient home (torch 2.14 copies
        synchronously when a hook reads the gradient; this covers a
        non-blocking copy too). The worker waits, not the backward's thread."""
        ready = None
        if self._device is not None:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self._device))
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="torch_uvm-fsdp-host-step")

        def work():
            if ready is not None:
                ready.synchronize()
            start = time.perf_counter()
            with host_step.stepping_threads(self.threads, self._rank_threads):
                self._step(unit, on_local_shards=self.on_local_shards)
                self._let_go(unit)
            self._host_seconds += time.perf_counter() - start     # (this thread's alone)
            self._host_steps += 1
        self._queued.append(self._worker.submit(work))

    def stats(self) -> dict:
        """Since install: the groups stepped on the host's worker, the
        seconds those steps took there, and the seconds the next forward,
        ``optimizer.step()`` and ``zero_grad()`` waited for them."""
        return {"host_steps": self._host_steps, "host_seconds": self._host_seconds,
                "waited_seconds": self._waited_seconds}

    def pending(self) -> int:
        """The host's steps queued and not yet done."""
        return sum(not f.done() for f in self._queued)

    def wait(self) -> None:
        """Every queued step done. If one failed, its error raises here,
        after all of them ended: the step is then over (the next forward
        may take gradients), the failed groups keep their gradients and
        their weights, and another optimizer.step() steps them again."""
        queued, self._queued = self._queued, []
        start = time.perf_counter()
        failed = [e for e in (f.exception() for f in queued) if e is not None]  # (each waits)
        if queued:
            self._waited_seconds += time.perf_counter() - start
        if failed:
            self.lifecycle.step_ends()
            raise failed[0]

    def _after_queued_steps(self, own):
        def call(*args, **kwargs):
            self.wait()
            return own(*args, **kwargs)
        return call

    def _let_go(self, unit: int) -> None:
        """The group's gradients the optimizer holds, let go after its step
        (another optimizer's stay)."""
        with self._stepping:      # (never while a step elsewhere narrows the param groups)
            held = self._held()
            for p in self.params[unit]:
                if id(p) in held and p.grad is not None:
                    if p.grad.is_cuda:    # its memory is not reused before the step read it
                        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                        local.record_stream(torch.cuda.current_stream())
                    p.grad = None

    def _step(self, unit: int, on_local_shards: bool = False) -> None:
        """The optimizer's own step over the group's parameters with
        gradients (its global step hooks run once a group); on the worker,
        through their local shards."""
        ids = {id(p) for p in self.params[unit] if p.grad is not None}
        if ids:
            with self._stepping:
                step_over(self.optimizer, self._own_step, ids, {}, on_local_shards)

    def end_backward(self) -> None:
        """The backward's end: the compute stream waits for the steps taken
        on FSDP2's streams; units with part of their gradients step in
        optimizer.step()."""
        self.lifecycle.end_backward()
        for event in self._events:
            torch.cuda.current_stream().wait_event(event)
        self._events.clear()

    def step(self, closure=None):
        """optimizer.step(): the groups that did not step in backward step
        now; then every group may step again."""
        if closure is not None:
            raise ValueError("torch_uvm: step(closure) runs the closure's backward, whose "
                             "groups step in it already (step_in_backward): call the "
                             "closure, then step() without it")
        self.wait()
        done = set(self.lifecycle.stepped_units())
        for unit in range(len(self.params)):
            if unit not in done and any(p.grad is not None for p in self.params[unit]):
                self._step(unit)
                self.lifecycle.stepped(unit, False)
        self.lifecycle.step_ends()

    def stepped_in_backward(self, params) -> List[str]:
        """The groups among `params`' that stepped in this backward: what a
        clipping of them would not see (clipping.py asks)."""
        ids = {id(p) for p in params}
        return [self.names[u] for u in self.lifecycle.stepped_in_backward()
                if any(id(p) in ids for p in self.params[u])]

    def undo(self) -> None:
        """The hooks removed and the optimizer's own methods back, after the
        host's steps queued (a failed one's error raises after)."""
        try:
            self.wait()
        finally:
            if self._worker is not None:
                self._worker.shutdown()
                self._worker = None
            for h in self._hooks:
                h.remove()
            self._hooks.clear()
            self.optimizer.step = self._own_step
            for name, own in self._waits_first.items():
                setattr(self.optimizer, name, own)
            del self.optimizer._torch_uvm_shard_steps
            clipping.unwatch(self)


def step_in_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> ShardSteps:
    """Each FSDP2 param group of `model` steps with `optimizer` as soon as
    its reduced gradients are complete, in the backward (the module's doc).
    Call it after ``fully_shard`` and after making the optimizer over
    ``model.parameters()``. Refused, before anything changes: a model
    without ``fully_shard``, an optimizer over other parameters or already
    so, and LBFGS."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("torch_uvm: LBFGS cannot step a group at a time: its step evaluates "
                         "the closure several times over every parameter")
    groups = param_groups(model)
    if not groups:
        raise ValueError("torch_uvm: fsdp.step_in_backward steps FSDP2's param groups, and this "
                         "model has none: call fully_shard on its blocks and on the model first")
    if getattr(optimizer, "_torch_uvm_shard_steps", None) is not None:
        raise ValueError("torch_uvm: this optimizer steps in backward already "
                         "(fsdp.step_in_backward was called for it)")
    # (the host's worker runs the optimizer's own step beside FSDP2's collectives:
    # one whose step communicates could meet them in another order on each rank)
    if any(p.device.type == "cpu" for _, ps in groups for p in ps) and \
            not isinstance(optimizer, ELEMENTWISE):
        raise ValueError(f"torch_uvm: shards on the CPU step on a worker thread beside the "
                         f"backward, with torch.optim's elementwise optimizers "
                         f"({', '.join(c.__name__ for c in ELEMENTWISE)}); this one is a "
                         f"{type(optimizer).__name__}, whose step may communicate: step after "
                         f"backward without fsdp.step_in_backward")
    ours = {id(p) for _, ps in groups for p in ps}
    others = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in ours]
    if others:
        raise ValueError(f"torch_uvm: the optimizer holds {len(others)} parameters that are not "
                         f"the sharded model's (made before fully_shard, or another model's): "
                         f"make it after fully_shard, from model.parameters()")
    on_host = any(p.device.type == "cpu" for _, ps in groups for p in ps)
    threads = host_step.rank_threads() if on_host else 0   # (a bad variable refused here)
    return ShardSteps(model, optimizer, groups, threads)
