"""Model offload: a module's weights under a residency budget (residency.py),
a resident prefix and the rest streamed, for inference and training
(the training side, backward and the optimizer: offload_training.py)."""
from __future__ import annotations

import types
import weakref
from typing import Dict, List, Optional

import torch

from . import _C, offload_training
from .residency import (_BUDGET, _ENDED, _LEASES, _LOCK, _Lease, _Range, _advise_streamed,
                        _bring, _collect_dropped_offloads, _cuda, _end_lease, _set_busy,
                        _span_bytes, get_residency_limit)

class _Unit:
    """A module with parameters or buffers of its own, streamed as one."""
    __slots__ = ("name", "module", "ranges", "nbytes", "ready", "resident", "grads_expected",
                 "grads_seen")

    def __init__(self, name: str, module: torch.nn.Module, ranges: List[_Range]):
        self.name, self.module, self.ranges = name, module, ranges
        self.nbytes = sum(r.nbytes for r in ranges)
        self.ready: Optional[torch.cuda.Event] = None
        self.resident = False
        self.grads_expected = self.grads_seen = 0


MODES = ("auto", "in_place", "prefetch")
# Inputs of at most this many rows (tokens) read streamed weights in place:
# a GEMM of 16 or 128 rows reads a weight in host memory as fast as a pinned
# copy of it, one of 1024 rows 4x slower (benchmarks/results/*-mechanisms.md).
IN_PLACE_MAX_ROWS = 128


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


class Offloaded:
    """What :func:`offload` did to a module; :meth:`undo` reverses it."""

    def __init__(self, module, device, budget, ahead, mode, units, handles, originals):
        self.module, self.device, self.budget, self.ahead = module, device, budget, ahead
        self.mode = mode              # "auto" until the first forward decides
        self.units: List[_Unit] = units
        self.order: List[_Unit] = []
        self.learned = False
        self.side = torch.cuda.Stream(device)
        self._handles = handles
        self._originals = originals
        self._lease = _Lease(device, budget, type(module).__name__, self._ranges())
        # dropped without undo: the next sweep gives back what it held
        self._finalizer = weakref.finalize(self, _ENDED.append, self._lease)
        self._finalizer.atexit = False
        self._advised = False
        self.training = False         # the first forward built a graph
        self._pinned: set = set()     # addresses of the resident units' ranges
        self._optimizers: List[tuple] = []   # (optimizer, its own step)

    def _ranges(self) -> List[_Range]:
        unique = {}
        for u in self.units:
            for r in u.ranges:
                unique.setdefault(r.address, r)
        return list(unique.values())

    def _begin(self, args, kwargs) -> None:
        """Before the module's first forward: choose how its weights stream."""
        if self._advised:
            return
        self._advised = True
        self.training = torch.is_grad_enabled()
        if self.mode == "auto":
            small = _rows((args, kwargs)) <= IN_PLACE_MAX_ROWS
            self.mode = "in_place" if small and not self.training else "prefetch"
        # training writes the weights every step: a GPU write to a read-mostly
        # page is a fault that collapses its copies (54 s a step in the first
        # run of benchmarks/offload_generate_train.py), so they migrate instead
        _advise_streamed(self._ranges(), self.device, in_place=self.mode == "in_place",
                         read_mostly=not self.training)

    # the order of the first forward decides what stays resident
    def _plan(self) -> None:
        self.learned = True
        seen = set()
        order = [u for u in self.order if not (id(u) in seen or seen.add(id(u)))]
        order += [u for u in self.units if id(u) not in seen]
        self.order = order
        # read in place, streamed weights take no GPU memory: no window
        window = 0 if self.mode == "in_place" else \
            (self.ahead + 1) * max((u.nbytes for u in order), default=0)
        # training: gradients and optimizer states share the budget, so
        # nothing is pinned resident; least recently used decides
        room = 0 if self.training else self.budget - window
        for u in order:               # a resident prefix: it never leaves
            if u.nbytes <= room:
                room -= u.nbytes
                u.resident = True
            else:
                break
        streamed = [u for u in order if not u.resident]
        if not streamed and not self.training:   # everything fits: nothing streams
            for u in order:
                u.resident = True
        for u in order:
            if u.resident:
                _bring(u.ranges, self.device, torch.cuda.current_stream(self.device), self.training)
                _set_busy(u.ranges, True)
                self._pinned.update(r.address for r in u.ranges)

    def _pre(self, unit: _Unit) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"torch_uvm: the offloaded module '{unit.name}' ran inside a CUDA "
                               "graph capture; streamed weights cannot be captured. Undo the "
                               "offload (or give it a budget that holds the whole model) first.")
        compute = torch.cuda.current_stream(self.device)
        if not self.learned:
            self.order.append(unit)
            if self.mode == "prefetch":
                _bring(unit.ranges, self.device, compute, self.training)
                _set_busy(unit.ranges, True)
            return
        if self.mode == "in_place":   # resident, or read where it is
            return
        if unit.ready is not None:
            compute.wait_event(unit.ready)
            unit.ready = None
        if not unit.resident:         # prefetched: only touched; else (left since) brought
            _bring(unit.ranges, self.device, compute, self.training)
        _set_busy(unit.ranges, True)
        for u in self._upcoming(unit):   # the next `ahead` streamed units
            if u.ready is None:
                # No wait for the compute stream: what leaves for room was
                # waited for on the host (_evict), and u is not in use.
                with torch.cuda.stream(self.side):
                    _bring(u.ranges, self.device, self.side, self.training)
                    u.ready = self.side.record_event()
                _set_busy(u.ranges, True)        # until it has run

    def _upcoming(self, unit: _Unit) -> List[_Unit]:
        """The `ahead` streamed units that run after `unit`, wrapping round
        to the next forward."""
        i = self.order.index(unit)
        # training: backward, not the next forward, follows the last unit
        cyclic = self.order[i + 1:] + ([] if self.training else self.order[:i + 1])
        return [u for u in cyclic if not u.resident and u is not unit][:self.ahead]

    def _post(self, unit: _Unit, output=None) -> None:
        offload_training.after_forward(self, unit, output)
        if self.mode == "in_place" and not unit.resident:
            return                    # read in place: nothing was brought
        done = torch.cuda.current_stream(self.device).record_event()
        for r in unit.ranges:
            r.last_use = done
        if not unit.resident or not self.learned:
            self._unpin(unit.ranges)

    def _unpin(self, ranges: List[_Range]) -> None:
        """Not busy any more, except a weight shared with a resident unit."""
        _set_busy([r for r in ranges if r.address not in self._pinned], False)

    def stream_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Make `optimizer.step()` step one submodule at a time within the
        budget (offload_training.py). Create the optimizer after offload; its
        states are managed (UVM on) and count in the budget. Returns it."""
        offload_training.check_optimizer(self, optimizer)
        own = optimizer.step
        self._optimizers.append((optimizer, own))
        # a method, as LR schedulers expect of optimizer.step
        optimizer.step = types.MethodType(
            lambda opt, closure=None: self._step(opt, own, closure), optimizer)
        return optimizer

    def _step(self, optimizer, own, closure):
        if closure is not None:
            raise ValueError("torch_uvm: a streamed optimizer step takes no closure; call the "
                             "closure (forward and backward) first, then step()")
        offload_training.step(self, optimizer, own)

    def finish_first_forward(self) -> None:
        if not self.learned:
            for u in self.units:
                _set_busy(u.ranges, False)
            self._plan()

    def undo(self) -> None:
        """Stop streaming: hooks removed, advice unset, parameters and buffers
        back to the tensors they were (their values included)."""
        torch.cuda.synchronize(self.device)
        for h in self._handles:
            h.remove()
        offload_training.forget(self)
        for optimizer, _ in self._optimizers:
            optimizer.__dict__.pop("step", None)   # the class's step again
        self._optimizers.clear()
        self._finalizer.detach()
        _end_lease(self._lease)
        with torch.no_grad():
            for (owner, name, kind), original in self._originals.items():
                current = getattr(owner, name)
                original.copy_(current.to(original.device))
                if kind == "param":
                    owner._parameters[name] = original
                else:
                    owner._buffers[name] = original
        del self.module._torch_uvm_offloaded


def _direct_tensors(module: torch.nn.Module):
    for name, p in module._parameters.items():
        if p is not None:
            yield name, p, "param"
    for name, b in module._buffers.items():
        if b is not None:
            yield name, b, "buffer"


def offload(module: torch.nn.Module, budget: Optional[int] = None, device=None,
            ahead: int = 1, mode: str = "auto") -> Offloaded:
    """Run `module` on `device` with at most `budget` bytes of its weights
    resident there (default: the device's residency limit).

    Parameters and buffers become managed tensors seen on `device` (the
    module's tensors are replaced; their values are kept). The first forward
    learns the order in which submodules run; after it, the longest prefix of
    that order that fits the budget (less a window of ``ahead + 1`` of the
    largest submodules) stays resident, and the rest streams: while submodule
    i runs, the next `ahead` are prefetched on a side stream, and the least
    recently used leave. For inference (``torch.no_grad()``, ``generate``).

    `mode` says how the streamed weights reach the kernels:
    ``"in_place"``: kernels read them in host memory over PCIe, with no GPU
    memory and no window (the whole budget stays resident); as fast as a
    pinned copy for small batches. ``"prefetch"``: read-mostly GPU copies
    made `ahead` submodules early and dropped after use. ``"auto"``
    (default): in place when the first forward runs without grad on inputs
    of at most IN_PLACE_MAX_ROWS rows (tokens), else prefetch.
    Returns a handle whose ``undo()`` puts the module back."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"offload expects a torch.nn.Module, got {type(module).__name__}")
    if getattr(module, "_torch_uvm_offloaded", None) is not None:
        raise RuntimeError("torch_uvm: this module is already offloaded; call undo() on the "
                           "handle offload returned before offloading it again")
    if not isinstance(ahead, int) or ahead < 1:
        raise ValueError(f"ahead must be a positive int, got {ahead!r}")
    if mode not in MODES:
        raise ValueError(f"torch_uvm: offload mode must be one of {MODES}, got {mode!r}")
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("torch_uvm: cannot offload a module during a CUDA graph capture")
    device = _cuda(device)
    devices = {t.device for _, m in module.named_modules() for _, t, _ in _direct_tensors(m)}
    gpus = {d for d in devices if d.type == "cuda"}
    if len(gpus) > 1 or (gpus and next(iter(gpus)) != device):
        raise ValueError(f"torch_uvm: the module's tensors are on {sorted(map(str, devices))}; "
                         f"offload needs them on the CPU or on {device} alone. Move the module "
                         f"to one device first")
    if budget is None:
        budget = get_residency_limit(device)
        if budget is None:
            raise ValueError("torch_uvm: offload needs a budget: pass budget= (bytes) or set "
                             "torch_uvm.set_residency_limit for the device")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"the budget must be a positive number of bytes, got {budget!r}")
    if budget > _C.memory_cap():
        raise ValueError(f"a budget of {budget} bytes is above the managed memory cap "
                         f"({_C.memory_cap()} bytes)")
    meta = [f"{name}.{tname}" if name else tname for name, m in module.named_modules()
            for tname, t, _ in _direct_tensors(m) if t.is_meta]
    if meta:
        raise ValueError(f"torch_uvm: offload needs the weights' values, and {', '.join(meta[:3])}"
                         f"{' ...' if len(meta) > 3 else ''} are on the meta device. Load them "
                         f"first (load_state_dict(..., assign=True) or to_empty + load)")
    plan = []
    for name, m in module.named_modules():
        own = list(_direct_tensors(m))
        if own:
            nbytes = sum(_span_bytes(t) for _, t, _ in own)
            plan.append((name or type(m).__name__, m, own, nbytes))
    if not plan:
        raise ValueError("torch_uvm: the module has no parameters or buffers to offload")
    largest = max(plan, key=lambda p: p[3])
    window = (ahead + 1) * largest[3]
    if budget < window and mode != "in_place":
        raise ValueError(f"torch_uvm: a budget of {budget} bytes cannot stream submodule "
                         f"'{largest[0]}' ({largest[3]} bytes): it needs at least {window} "
                         f"bytes (ahead + 1 = {ahead + 1} of the largest submodule). Raise "
                         f"the budget, lower ahead, or read it in place (mode='in_place')")
    limit = get_residency_limit(device)
    if limit is not None and budget > limit:
        _collect_dropped_offloads()   # a limit set by one goes with it
        limit = get_residency_limit(device)
    if limit is not None and budget > limit:
        raise ValueError(f"torch_uvm: a budget of {budget} bytes is above {device}'s residency "
                         f"limit ({limit} bytes): raise the limit (set_residency_limit) or "
                         f"lower the budget")
    # Phase 1 makes every replacement and changes nothing in the module, so
    # a failure here (out of memory, say) leaves it as it was.
    shared: Dict[int, tuple] = {}     # id(tensor) -> (its replacement, _Range or None): tied
    with torch.no_grad():
        for _, _, own, _ in plan:
            for _, t, kind in own:
                if id(t) in shared:
                    continue
                if t.numel() == 0:    # no memory to manage: it just moves
                    seen, r = t.detach().to(device), None
                else:
                    managed = t.detach() if _C.is_managed(t) else \
                        _C.manage_memory(t.detach().to("cpu"))
                    seen = _C.alias_on_device(managed, device) \
                        if managed.device != device else managed
                    r = _Range(managed, owned=True)
                if kind == "param":
                    seen = torch.nn.Parameter(seen, requires_grad=t.requires_grad)
                shared[id(t)] = (seen, r)
    # Phase 2 puts them in: dictionary stores, which cannot fail half-way.
    originals, units, handles = {}, [], []
    for name, m, own, _ in plan:
        ranges = []
        for tname, t, kind in own:
            seen, r = shared[id(t)]
            originals[(m, tname, kind)] = t
            (m._parameters if kind == "param" else m._buffers)[tname] = seen
            if r is not None and all(x is not r for x in ranges):
                ranges.append(r)
        units.append(_Unit(name, m, ranges))
    handle = Offloaded(module, device, budget, ahead, mode, units, handles, originals)
    handles.append(module.register_forward_pre_hook(
        lambda _m, args, kwargs: handle._begin(args, kwargs), with_kwargs=True))
    for u in units:
        handles.append(u.module.register_forward_pre_hook(
            lambda _m, _a, u=u: handle._pre(u)))
        handles.append(u.module.register_forward_hook(
            lambda _m, _a, out, u=u: handle._post(u, out)))
    handles.append(module.register_forward_hook(
        lambda _m, _a, _o: handle.finish_first_forward()))
    offload_training.install(handle)
    with _LOCK:
        if limit is None:   # the budget becomes the device's residency limit
            _BUDGET.set_limit(device.index, budget)
            handle._lease.owns_limit = True
        _LEASES.add(handle._lease)
    module._torch_uvm_offloaded = handle
    return handle
