"""Stepping part of an offload's weights on the host
(``stream_optimizer(..., host_step=)``): Adam's arithmetic on the CPU over
the weights' homes, while the GPU runs the rest of the step.

Per fp32 parameter, a weight that steps on the GPU crosses the link five
times a step: in for forward and for backward, AdamW's two moments in and
out, the stepped weight home (16 bytes to the GPU, 12 home). One that steps
on the host crosses three times: in twice, its gradient home (8 and 4); its
moments never leave host memory. The host's step then takes its own time
beside the GPU's, at the rate of PyTorch's fused CPU AdamW (FSDP2's CPU
step; ``benchmarks/method.py``'s ``host_adamw_rate`` measures it).

* Which: the streamed submodules last in the forward's order, the
  ``host_step`` share of their trainable bytes. Their gradients complete
  first in backward, so the host steps them while the GPU runs the backward
  of the rest. Resident submodules step on the GPU, where their weights
  live.
* When: once a submodule's gradients are complete they go home by a copy
  that the compute stream does not wait for; its weights leave their slot
  (the host writes their homes: the next forward brings the stepped ones);
  a worker thread steps it once the copy has passed. Of the steps whose
  gradients are home, it takes the one the next forward needs first.
* ``optimizer.step()`` returns once every host step is done, as
  ``torch.optim`` promises; a forward that begins before it, ``undo()``
  and the optimizer's ``state_dict`` wait for them too. With
  ``non_blocking=True`` it returns at once: each submodule's next forward
  waits for its own step (the host steps the rest meanwhile), and no bring
  copies a home its step is writing (StreamExecutor::set_home_busy).
* The arithmetic is ``torch.optim``'s fused Adam/AdamW on the CPU
  (``torch.optim.adam.adam(fused=True)``): a weight stepped on the host
  equals a fused CPU step's, bit for bit, not a GPU step's.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import inspect
import math
import os
import threading
import time
from typing import TYPE_CHECKING, List, Optional

import torch
from torch.optim.adam import adam

from . import _C

if TYPE_CHECKING:
    from .offload_state import OffloadState
    from .offload_units import Unit


def check(optimizer: torch.optim.Optimizer, host_step) -> float:
    """`host_step` as a share in [0, 1], or a clear refusal, before anything
    changes, of a value or an optimizer it cannot be."""
    if isinstance(host_step, bool) or not isinstance(host_step, (int, float)) or \
            not math.isfinite(host_step) or not 0 <= host_step <= 1:
        raise ValueError(
            f"torch_uvm: host_step is the share of the streamed submodules' trainable bytes "
            f"stepped on the host, a number from 0 (none, the default) to 1 (every streamed "
            f"one); got {host_step!r}")
    if host_step == 0:
        return 0.0
    # a bad TORCH_UVM_HOST_STEP_THREADS or _COPIES is refused now (config.cpp parses both at once)
    threads()
    # (torch.optim wraps each class's step when its first instance is made:
    # compared unwrapped, a subclass that only inherits it is Adam's own)
    if inspect.unwrap(type(optimizer).step) not in (inspect.unwrap(torch.optim.Adam.step),
                                                    inspect.unwrap(torch.optim.AdamW.step)):
        raise ValueError(
            f"torch_uvm: host_step steps with PyTorch's fused CPU Adam/AdamW, and this "
            f"optimizer is a {type(optimizer).__name__} (with a step of its own). Use "
            f"torch.optim.Adam or AdamW, or host_step=0 (every submodule steps on the GPU "
            f"with the optimizer's own step); host_step is every optimizer's of an offload")
    for g in optimizer.param_groups:
        if g.get("differentiable"):
            raise ValueError("torch_uvm: host_step cannot step a differentiable Adam "
                             "(differentiable=True): use host_step=0")
    return float(host_step)


def check_non_blocking(non_blocking, host_step: float, offloads: Optional[bool] = None) -> None:
    """`non_blocking` as a bool that has host steps to apply to, and the
    offload's (`offloads`, where it streams an optimizer already), or a
    clear refusal before anything changes."""
    if not isinstance(non_blocking, bool):
        raise ValueError(f"torch_uvm: non_blocking is True or False; got {non_blocking!r}")
    if offloads is not None and non_blocking != offloads:
        raise ValueError(
            f"torch_uvm: this offload streams another optimizer with non_blocking={offloads}; "
            f"every optimizer of one offload takes the same non_blocking (got {non_blocking})")
    if non_blocking and not host_step:
        raise ValueError(
            "torch_uvm: non_blocking=True lets optimizer.step() return before the host's "
            "steps end, and this offload steps nothing on the host: give host_step (the "
            "share of the streamed submodules stepped there) or leave non_blocking False")


THREADS_VARIABLE = "TORCH_UVM_HOST_STEP_THREADS"
COPIES_VARIABLE = "TORCH_UVM_HOST_STEP_COPIES"
# In backward, the gradients whose copies home may be under way before the
# backward's thread waits for the oldest (HostSteps._limit_copies), as a
# share of the offload's budget (and one submodule's, whatever its size);
# TORCH_UVM_HOST_STEP_COPIES sets another (copies_share()). They sit in
# PyTorch's memory, beside the slots the budget reserves, until their
# copies pass (the budget's books count them as leaving), so the process
# holds at most this share (or one submodule's) more than the budget for
# them. The further the backward runs ahead, the more its copies bunch
# beside the host's AdamW, in the host's memory: on an H100 host
# (2026-11-27, benchmarks/results/2026-11-27-h100,
# offload_train-*-copies-share*) an eighth, against 1% (about one
# submodule), stepped the 3B full fine-tune under 8 GiB 1.05-1.12x faster
# and GPT-2 (1.2B, 4 GiB), where the host's AdamW is most of the step,
# 0.84x; neither's peak GPU memory moved.
COPIES_AHEAD_SHARE = 1 / 8


def threads() -> int:
    """The threads a host step runs on: TORCH_UVM_HOST_STEP_THREADS, else
    PyTorch's intra-op threads but two, left to the Python thread that
    launches the GPU's kernels and to the driver's (a host step runs
    beside them; with every core the GPU waits for its launches). The
    variable is parsed with the other options (csrc/core/config.cpp)."""
    return _C.offload_environment()["host_step_threads"] or max(1, torch.get_num_threads() - 2)


def rank_threads() -> int:
    """The threads one rank's host step runs on where ranks share the host
    (fsdp.step_in_backward): TORCH_UVM_HOST_STEP_THREADS, else the rank's
    share of the cores it may run on, but two (left to its launching thread,
    as in threads()). The ranks on this host: LOCAL_WORLD_SIZE (torchrun,
    accelerate and Lightning set it), else the default process group's size
    (over several hosts, more than this host's: fewer threads, never too
    many). A rank already bound to some of the cores (taskset, Slurm,
    numactl) takes those it is bound to.
    Not PyTorch's intra-op threads: torchrun sets OMP_NUM_THREADS=1 for each
    rank, and the host's AdamW on one thread would be most of a step. (On
    two H200s of 32 cores, 2026-11-29, a worker on PyTorch's threads (each
    rank's OMP_NUM_THREADS, 16) stepped in backward 1.16-1.31x slower than FSDP2's own step
    after it: benchmarks/results/2026-11-29-h200-x2. This share is not yet
    measured there.)"""
    chosen = _C.offload_environment()["host_step_threads"]
    if chosen:
        return chosen
    local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if local and not (local.isdigit() and int(local) >= 1):
        raise ValueError(f"torch_uvm: LOCAL_WORLD_SIZE is the number of ranks on this host, a "
                         f"whole number of at least 1; got {local!r}")
    ranks = int(local or 0)
    if ranks < 1:
        import torch.distributed as dist
        ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    cores = os.cpu_count() or 1
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    share = mine if mine < cores else cores // ranks     # (bound already: its own cores)
    return max(1, share - 2)


@contextlib.contextmanager
def stepping_threads(count: int, after: int):
    """A worker's host step on `count` intra-op threads, then `after` again:
    a new thread's default is every core, and torch.set_num_threads also
    sets what threads started later take. `count` 0: left as they are."""
    if count <= 0:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(after)


def copies_share() -> float:
    """The share of the budget the gradients copying home in backward may
    take before the backward waits (COPIES_AHEAD_SHARE):
    TORCH_UVM_HOST_STEP_COPIES, a number from 0 (one submodule's at a
    time) to 1, else COPIES_AHEAD_SHARE (csrc/core/config.cpp parses it)."""
    share = _C.offload_environment()["host_step_copies"]
    return COPIES_AHEAD_SHARE if share < 0 else share


def choose(state: "OffloadState") -> List["Unit"]:
    """The units that step on the host now: the streamed ones last in the
    forward's order, `state.host_step` of the streamed trainable bytes
    (a unit is taken when at least half of it falls within the share)."""
    if not state.host_step or not state.learned:
        return []
    streamed = [u for u in state.units_in_order()
                if not state.executor.resident(u.index) and u.trainable]
    want = state.host_step * sum(u.trainable_bytes for u in streamed)
    chosen, taken = [], 0
    for u in reversed(streamed):
        if taken + u.trainable_bytes / 2 > want:
            break
        chosen.append(u)
        taken += u.trainable_bytes
    return chosen


def steps_to_gpu(optimizer: torch.optim.Optimizer, params) -> None:
    """A weight that stepped on the host before (the plan changed since)
    keeps its step count on the CPU; a fused or capturable step on the GPU
    reads it on the weight's device: it goes there (a host step takes it
    back)."""
    ids = {id(p) for p in params}
    for group in optimizer.param_groups:
        if not (group.get("fused") or group.get("capturable")):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step") if id(p) in ids else None
            if isinstance(step, torch.Tensor) and not step.is_cuda:
                optimizer.state[p]["step"] = step.to(p.device)


def _cpu_view(t: torch.Tensor) -> Optional[torch.Tensor]:
    """`t` (a CUDA tensor at its home) as a CPU tensor over that memory;
    None where it is not at a home (in a slot)."""
    view = _C.home_on_cpu(t)
    if view is None and _C.is_pinned_home(t):     # a home no executor took over
        view = _C.fresh_home_on_cpu(t)
    return view


class _Queued:
    """One unit's step on the host, queued: what it waits for and steps, and
    its future."""
    __slots__ = ("index", "name", "rank", "ready", "work", "future")

    def __init__(self, index: int, name: str, rank: int, ready, work):
        self.index, self.name, self.rank, self.ready, self.work = index, name, rank, ready, work
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def ready_now(self) -> bool:
        try:
            return all(event.query() for event in self.ready)
        except Exception:   # (a CUDA error: its step's synchronize() raises it, into its future)
            return True


class HostSteps:
    """One offload's host steps: a worker thread, and the steps queued on it
    not yet waited for.

    The worker takes, of the steps whose gradients are home, the one whose
    submodule the next forward runs first (in backward, about the latest
    queued): what is left when the backward ends is what the next forward
    needs last. With `non_blocking`, optimizer.step() returns before the host's
    steps end, and each submodule's next forward waits for its own."""

    def __init__(self, device: torch.device):
        self.device = device
        self.non_blocking = False       # stream_optimizer(non_blocking=)
        self._worker: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pending: List[_Queued] = []       # not yet waited for, in the order queued
        self._waiting: List[_Queued] = []       # not yet begun (the worker's to choose)
        self._lock = threading.Lock()
        self._executor = None                   # the executor whose homes they write
        self.copies_share = COPIES_AHEAD_SHARE  # copies_share(), read by stream_optimizer
        self.copies_cap: Optional[int] = None   # under gpu_memory, set by stream_optimizer
        self._home_stream = self._side = None   # the executor's, and one for the worker's reads
        self._threads = 0               # threads(), read at the first step
        self._caller_threads = 0        # the caller's count then, given back after each step
        # what the host's steps took, and the caller's waits for them (stats())
        self._stepped = {"units": 0, "step_seconds": 0.0, "wait_seconds": 0.0,
                         "copy_wait_seconds": 0.0}
        self._spans: collections.deque = collections.deque(maxlen=4096)   # spans()

    @property
    def threads(self) -> int:
        """The host threads its steps take (threads(); 0 before the first)."""
        return self._threads

    def submit(self, state: "OffloadState", unit: "Unit", optimizers, in_backward: bool) -> bool:
        """Queues `unit`'s step on the host, for each of `optimizers` (the
        (optimizer, its own step) pairs stepping it), after the copies home
        queued so far (its gradients') and the compute stream's work so far
        (gradients accumulated at home, kernels reading its weights in
        place, what the user did to the gradients). Its weights leave their
        slot first, and no bring copies its homes until it is done. The
        hyperparameters and a GradScaler's scale are read now (a scheduler
        or the scaler's update may change them before it runs). Queued in
        backward, or with `non_blocking`, the parameters' gradients are
        None from then on (the host holds them until its step). Returns
        False, queuing nothing, where its weights or gradients are not all
        at home (held on the GPU): the caller steps it on the GPU."""
        executor = state.executor
        self.wait_unit(unit.index)      # its last, were it pending
        executor.evict_unit(unit.index)
        # every parameter with a gradient, as offload_training._step_unit
        # (one frozen since, that kept its gradient, too)
        params = [p for p in unit.params if p.grad is not None]
        views = [(_cpu_view(p), _cpu_view(p.grad)) for p in params]
        if not params or any(w is None or g is None for w, g in views):
            return False
        if self._home_stream is None:
            self._home_stream = torch.cuda.ExternalStream(executor.home_stream(),
                                                          device=self.device)
            self._side = torch.cuda.Stream(self.device)
        work = []
        for optimizer, _ in optimizers:
            # a GradScaler's scale and overflow flag, which a fused Adam reads
            # itself (copied on the compute stream: its update is in place)
            scaling = tuple(None if t is None else t.clone() for t in
                            (getattr(optimizer, "grad_scale", None),
                             getattr(optimizer, "found_inf", None)))
            for group in optimizer.param_groups:
                ids = {id(p) for p in group["params"]}
                mine = [(p, w, g, p.grad) for p, (w, g) in zip(params, views) if id(p) in ids]
                if mine:
                    work.append((optimizer, _hyperparameters(group), mine, scaling))
                for p, *_ in mine:  # (the worker fills them: no new keys while the user runs)
                    optimizer.state.setdefault(p, {})
        ready = [torch.cuda.Event(), torch.cuda.Event()]
        ready[0].record(self._home_stream)
        ready[1].record(torch.cuda.current_stream(self.device))
        if in_backward:
            self._limit_copies(executor, self.copies_limit(state.budget))
        if self._worker is None:
            self._threads = threads()
            self._caller_threads = torch.get_num_threads()
            self._worker = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="torch_uvm_host_step")
        rank = state.forward_rank(unit)
        item = _Queued(unit.index, unit.name, rank, ready, work)
        with self._lock:
            self._waiting.append(item)
        try:
            self._worker.submit(self._run_next)
        except BaseException:
            with self._lock:
                self._waiting.remove(item)
            raise
        self._executor = executor
        executor.set_home_busy(unit.index, True)
        self._pending.append(item)
        if in_backward or self.non_blocking:   # the host holds them until its step
            for _, _, mine, _ in work:
                for p, *_ in mine:
                    p.grad = None
        return True

    def copies_limit(self, budget: int) -> int:
        """The bytes of gradients that may be copying home in backward before
        it waits: copies_share of the `budget`, held within `copies_cap`
        where an offload's gpu_memory set one (the gradients in flight its
        plan counted: they sit beside the slots)."""
        limit = int(self.copies_share * budget)
        return limit if self.copies_cap is None else min(limit, self.copies_cap)

    def _limit_copies(self, executor, limit: int) -> None:
        """In backward the compute stream does not wait for the gradients'
        copies home, and the host queues kernels far ahead of the GPU: the
        memory of gradients whose copies are under way is reused only once
        they pass, so PyTorch's allocator would reserve more the further it
        runs ahead. Beyond `limit` bytes under way (copies_share() of the
        budget), the executor waits for the oldest, down to the newest
        alone (core/home_copies.h: the one throttle on copies home)."""
        start = time.perf_counter()
        executor.limit_copies_home(limit)
        self._stepped["copy_wait_seconds"] += time.perf_counter() - start

    def _next(self) -> _Queued:
        """Of the steps not begun, the one whose submodule runs first in the
        next forward among those whose gradients are home; the oldest if
        none is."""
        with self._lock:
            ready = [q for q in self._waiting if q.ready_now()]
            item = min(ready, key=lambda q: q.rank) if ready else self._waiting[0]
            self._waiting.remove(item)
        return item

    def _run_next(self) -> None:
        item = self._next()
        start = time.time_ns()
        try:
            with stepping_threads(self._threads, self._caller_threads):    # threads()
                self._step(item.ready, item.work)
        except BaseException as e:      # raised where it is waited for, naming its unit
            self._spans.append((item.name, start, time.time_ns()))
            item.future.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
        else:
            self._spans.append((item.name, start, time.time_ns()))
            item.future.set_result(None)

    def _step(self, ready: List[torch.cuda.Event], work) -> None:
        for event in ready:                     # (the states may be read from the GPU below)
            event.synchronize()
        # what it reads from the GPU (a GradScaler's scale, states a GPU step
        # left) is ready: read on a stream of its own, not the default one,
        # which would wait for every GPU step queued since
        with torch.cuda.stream(self._side):
            prepared = [(isinstance(optimizer, torch.optim.AdamW), group,
                         _states(optimizer, group, mine, self.device),
                         [None if t is None else t.to("cpu") for t in scaling])
                        for optimizer, group, mine, scaling in work]
        start = time.perf_counter()
        for decoupled, group, lists, (grad_scale, found_inf) in prepared:
            _adam_on_cpu(decoupled, group, *lists, grad_scale=grad_scale, found_inf=found_inf)
        self._stepped["step_seconds"] += time.perf_counter() - start
        self._stepped["units"] += 1

    def _finish(self, items: List[_Queued]) -> None:
        """Waits for `items` (pending ones); their homes are free to bring
        from. The first that failed raises, naming its unit (the others ran)."""
        failed = []
        start = time.perf_counter()
        for item in items:          # (interrupted, those not waited for stay pending)
            try:
                item.future.result()
            except Exception as e:  # raised again below, with its unit
                failed.append((item.name, e))
            self._pending.remove(item)
            if self._executor is not None:
                self._executor.set_home_busy(item.index, False)
        self._stepped["wait_seconds"] += time.perf_counter() - start
        if failed:
            (name, e), others = failed[0], [n for n, _ in failed[1:]]
            more = f", and those of {others[:4]}{' ...' if len(others) > 4 else ''} too" \
                if others else ""
            raise RuntimeError(
                f"torch_uvm: the host step of submodule '{name}' failed ({e}){more}; their "
                "weights and states may be part-stepped. The other submodules stepped") from e

    def wait(self) -> None:
        """Every step queued is done."""
        self._finish(list(self._pending))

    def wait_unit(self, index: int) -> None:
        """The unit's steps queued are done."""
        self._finish([q for q in self._pending if q.index == index])

    def settle(self, index: Optional[int] = None) -> None:
        """The unit's step (if any) is done, and every step found done by
        now is waited for (their homes are free to bring from)."""
        self._finish([q for q in self._pending if q.index == index or q.future.done()])

    def before_forward(self, index: Optional[int] = None, recomputed: bool = False) -> None:
        """A forward begins (`index` None), or the forward of unit `index`:
        with `non_blocking`, that unit's step is done and those found done
        are waited for; else every step is done, but in a forward that a
        backward recomputes (activation checkpointing), where the host steps
        on."""
        if self.non_blocking:
            self.settle(index)
        elif not recomputed:
            self.wait()

    def end_step(self) -> None:
        """optimizer.step() returns: every host step is done, or, with
        `non_blocking`, those found done by now are waited for."""
        if self.non_blocking:
            self.settle()
        else:
            self.wait()

    def stats(self) -> dict:
        """Since the offload began: the units the host stepped, the seconds
        its steps took (the fused kernels, once their gradients were home),
        the seconds callers waited for them (optimizer.step(), a forward,
        undo): what the host's step added to the GPU's, and the seconds the
        backward waited for gradients' copies home (COPIES_AHEAD_SHARE)."""
        return dict(self._stepped)

    def spans(self) -> List[tuple]:
        """The last 4096 host steps: (submodule, start, end), in the wall
        clock's nanoseconds (time.time_ns(), as a torch.profiler trace's
        baseTimeNanoseconds), from its waits for the GPU to its last kernel."""
        return list(self._spans)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._worker is not None:
                self._worker.shutdown(wait=True)
                self._worker = None


def _hyperparameters(group: dict) -> dict:
    """What a host step reads of a parameter group, as it is now."""
    taken = {k: group[k] for k in ("betas", "lr", "weight_decay", "eps", "amsgrad", "maximize",
                                   "decoupled_weight_decay") if k in group}
    if isinstance(taken["lr"], torch.Tensor):
        taken["lr"] = float(taken["lr"])
    return taken


def _states(optimizer, group, mine, device):
    """The lists torch.optim.adam.adam takes, over CPU views of homes: the
    weights, gradients, Adam's moments (new homes on a first step) and step
    counts (CPU tensors)."""
    amsgrad = group.get("amsgrad", False)
    keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
    params, grads, steps = [], [], []
    moments = {k: [] for k in keys}
    for p, w, g, _ in mine:         # (the last: the gradient, held until its step is done)
        state = optimizer.state.get(p) or {}
        fresh = not state
        if fresh:
            state = {"step": torch.zeros((), dtype=torch.float32)}
        for k in keys:
            t = state.get(k)
            if t is None:                 # a first step: a new home, zeros
                t = state[k] = _C.empty_pinned_home(p, device)
                view = _C.fresh_home_on_cpu(t).zero_()
            elif t.is_cuda:
                view = _cpu_view(t)
                if view is None:          # in a slot (it stepped on the GPU): a home of its own
                    t = state[k] = _C.pinned_home(t.detach(), device)
                    view = _C.fresh_home_on_cpu(t)
            else:
                view = t
            moments[k].append(view)
        step = state["step"]
        if not isinstance(step, torch.Tensor) or step.is_cuda or step.dtype != torch.float32:
            state["step"] = step = torch.tensor(float(step), dtype=torch.float32)
        if fresh:
            optimizer.state[p] = state
        params.append(w)
        grads.append(g)
        steps.append(step)
    return (params, grads, moments["exp_avg"], moments["exp_avg_sq"],
            moments.get("max_exp_avg_sq", []), steps)


def _adam_on_cpu(decoupled: bool, group, params, grads, exp_avgs, exp_avg_sqs,
                 max_exp_avg_sqs, steps, grad_scale=None, found_inf=None) -> None:
    beta1, beta2 = group["betas"]
    adam(
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
        fused=True, grad_scale=grad_scale, found_inf=found_inf,
        amsgrad=group.get("amsgrad", False), has_complex=False,
        beta1=float(beta1), beta2=float(beta2),
        lr=group["lr"],           # (a float: _hyperparameters)
        weight_decay=group["weight_decay"], eps=group["eps"],
        maximize=group.get("maximize", False),
        decoupled_weight_decay=group.get("decoupled_weight_decay", decoupled))
