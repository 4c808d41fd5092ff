"""The offload's lifecycle on the CPU: its Python half (the handle's forward
hooks, offload_training's backward and streamed step) driven by a real
CPU model, over a fake executor that moves nothing and checks the calls the
C++ executor gets. The weights stay where they are, so a loop trained so
steps one unit at a time (the streamed step's narrowing of the optimizer's
groups, on the CPU's kernels) and must equal the same loop on a plain model
bit for bit. What it does not see: the bytes the executor moves, the host
step, resident units, and the GPU's kernels over subsets of a group.

    handle, executor = offload_on_cpu(model, budget)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()))

What the fake checks at each call (CallError when broken):
- a unit's forward and backward runs are opened before they are closed;
- a unit's gradients go home in a backward, at most once;
- a streamed step brings each unit at most once, between step_begins and
  the pass's end, and only units with gradients;
- the executor plans after a first forward, from the order it ran;
- a step in backward is queued inside a backward, and a unit's gradients
  come with at most STEPS_BEHIND steps under way.
Its books (`backwards`, `steps`, `most_behind`) let a test check the rest:
every unit with gradients sent them home, every one stepped, and no more
than STEPS_BEHIND steps were under way beside the one queued."""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Dict, List

import torch

from torch_uvm import host_step, offload_training
from torch_uvm.offload import Offloaded, hook_forward
from torch_uvm.offload_state import STEPS_BEHIND, OffloadState
from torch_uvm.offload_units import make_units, offload_plan, unit_roots


class CallError(AssertionError):
    """A call the C++ executor would not expect there."""


class FakeExecutor:
    def __init__(self, units):
        self.units = units
        # each parameter's unit: the one that streams its gradient (a tied
        # weight's first user, offload_training.install)
        self.index = {id(p): i for i, u in enumerate(units) for p in u.params}
        self._planned = False
        self.seen: List[int] = []
        self._order: List[int] = []
        self.trainable = {i: list(u.trainable) for i, u in enumerate(units)}
        self.running: Dict[int, bool] = {}
        self.home: Counter = Counter()       # their gradients sent home, this backward
        self.backwards: List[Dict[int, int]] = []   # each backward's `home`, at its end
        self.stepping = False
        self.stepped: Counter = Counter()
        self.steps: List[Dict[int, int]] = []       # each step's units brought
        self.in_backward = False
        self.behind = 0          # steps in backward queued and not yet waited for
        self.most_behind = 0     # the most under way as one was queued

    # plan
    def planned(self) -> bool:
        return self._planned

    def plan(self, per_streamed, per_any) -> None:   # (again for training: the same order)
        if not self.seen:
            raise CallError("a plan made before any forward ran")
        self._planned = True
        first = list(dict.fromkeys(self.seen))
        self._order = first + [i for i in range(len(self.units)) if i not in first]

    def order(self) -> List[int]:
        return list(self._order)

    def resident(self, i) -> bool:
        return False

    def largest_trainable(self) -> int:
        return max(sum(p.nbytes for p in ps) for ps in self.trainable.values())

    def set_trainable(self, i, params) -> None:
        self.trainable[i] = list(params)

    def set_training(self, training) -> None:
        pass

    def set_in_place(self, in_place) -> None:
        pass

    def streamed_per_pass(self, per_streamed, per_any) -> int:
        return 0

    def evict_all(self) -> None:
        if any(self.running.values()):
            raise CallError("evict_all while a unit runs")

    # passes
    def before(self, i, backward) -> None:
        if not self._planned and not backward:
            self.seen.append(i)
        if backward and not self.in_backward:
            self.in_backward = True
            self.home = Counter()
        self.running[i] = True

    def after(self, i) -> None:
        if not self.running.get(i):
            raise CallError(f"unit {i} closed without being opened")
        self.running[i] = False

    def grads_ready(self, i, home=True, wait=True) -> None:
        # (a unit whose backward did not begin may have gradients: another
        # unit uses its parameter, a tied weight)
        if not self.in_backward:
            raise CallError(f"unit {i}'s gradients came outside a backward")
        if self.behind > STEPS_BEHIND:
            raise CallError(f"unit {i}'s gradients came with {self.behind} steps in backward "
                            f"under way (at most {STEPS_BEHIND})")
        self.home[i] += 1
        if self.home[i] > 1:
            raise CallError(f"unit {i}'s gradients went home twice in one backward")
        self.running[i] = False

    def discard_grads(self, i) -> None:
        pass

    def step_queued(self, steps_behind) -> None:
        if not self.in_backward:
            raise CallError("a step in backward queued outside a backward")
        self.behind += 1
        self.most_behind = max(self.most_behind, self.behind)
        self.behind = min(self.behind, max(steps_behind, 1))  # the host waits for the oldest

    def end_pass(self) -> None:
        if self.in_backward:
            self.backwards.append(dict(self.home))
            self.in_backward = False
        if self.stepping:
            self.steps.append(dict(self.stepped))
            self.stepping = False
        self.running.clear()

    # steps
    def step_begins(self) -> None:
        self.stepping, self.stepped = True, Counter()

    def bring(self, tensors, fresh_bytes) -> None:
        units = {self.index[id(t)] for t in tensors if id(t) in self.index}
        if len(units) != 1:
            raise CallError(f"a step's bring of {len(units)} units")
        (i,) = units
        if self.stepping:
            self.stepped[i] += 1
            if self.stepped[i] > 1:
                raise CallError(f"unit {i} stepped twice in one step")

    def step_done(self, tensors, written) -> None:
        pass

    def bytes_on_gpu(self, i) -> int:
        return 0


class _Lease:
    share = -1
    executor = None


class _Stream:
    """torch.cuda.Stream's part that a step in backward uses, on the CPU."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other) -> None:
        pass


@contextlib.contextmanager
def cpu_streams():
    """torch.cuda's streams and capture check as no-ops: the lifecycle
    runs on a machine without a GPU."""
    saved = (torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream,
             torch.cuda.is_current_stream_capturing)
    torch.cuda.Stream = _Stream
    torch.cuda.current_stream = lambda *a, **k: _Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.is_current_stream_capturing = lambda: False
    try:
        yield
    finally:
        (torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream,
         torch.cuda.is_current_stream_capturing) = saved


def offload_on_cpu(module: torch.nn.Module, budget: int = 1 << 40, ahead: int = 1,
                   units=None):
    """The module's lifecycle hooked as offload() hooks it, its tensors left
    as they are, over a FakeExecutor: (handle, executor)."""
    plan = offload_plan(module)
    roots = unit_roots(module, units)
    shared = {id(t): t for _, _, own, _ in plan for _, t, _ in own}
    made = make_units(plan, roots, shared)
    for i, u in enumerate(made):
        u.index = i
    state = OffloadState(module, torch.device("cpu"), budget, ahead, "prefetch", made,
                         host_step.HostSteps(torch.device("cpu")), set())
    handle = Offloaded(state, {}, _Lease())
    handle._finalizer.detach()
    hook_forward(handle)
    offload_training.install(state)
    executor = FakeExecutor(made)
    state.executor = executor       # (made before the first forward: no CUDA executor)
    return handle, executor
