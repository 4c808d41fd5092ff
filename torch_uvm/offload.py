"""Larger than the GPU: a residency budget, and modules and batches streamed
through it.

The policy (what stays, what leaves and how) is core/residency.h's
ResidencyBudget; this file carries it out with prefetches and advice on a
side stream:

* a module's streamed weights are either read in place (kernels read host
  memory over PCIe: no GPU memory, nothing to evict; as fast as a pinned
  copy when a kernel reads its weights once, as a small batch does) or
  prefetched (see `offload`'s mode; measured in benchmarks/mechanisms.py);
* a range brought to a GPU is prefetched there on the side stream, and the
  compute stream waits for it before the kernels that read it;
* a range that was not written since it arrived (weights in inference,
  batches) is advised ``read_mostly`` with its preferred location on the CPU,
  so the GPU holds a read-only duplicate, and it leaves by dropping that
  duplicate (unset read-mostly collapses it to the CPU copy): nothing is
  copied back;
* a written range migrates back to the CPU;
* before a range leaves, the host waits for the last kernels that used it.
"""
from __future__ import annotations

import threading
from typing import Dict, Iterable, Iterator, List, Optional, Union

import torch

from . import _C

_BUDGET = _C.ResidencyBudget()
_LOCK = threading.RLock()
_RANGES: Dict[int, "_Range"] = {}       # address -> what is streamed there
# Ranges advised read-mostly with their home on the CPU (address -> bytes), so
# a batch streamed again is not advised again: advice on populated pages costs
# about 0.1 ms per MiB, five times its prefetch. Cleared by empty_cache, which
# may hand the memory back to the driver.
_ADVISED: Dict[int, int] = {}
_ENVIRONMENT_APPLIED: set = set()


class _Range:
    """The bytes of one managed tensor that torch_uvm streams (a slice of a
    larger tensor streams on its own). `owned`: a range of an offloaded
    module, which keeps it; other ranges (batches) are let go once they left
    the GPU, so streaming holds no batch past its eviction."""
    __slots__ = ("tensor", "address", "nbytes", "last_use", "device", "owned")

    def __init__(self, tensor: torch.Tensor, owned: bool = False):
        self.tensor = tensor.detach()
        self.address = tensor.data_ptr()
        self.nbytes = _span_bytes(tensor)
        self.last_use: Optional[torch.cuda.Event] = None
        self.device: Optional[torch.device] = None
        self.owned = owned


def _range_for(tensor: torch.Tensor) -> _Range:
    """The one _Range of `tensor`'s bytes: the registered one while they are
    streamed (so its last use is the one eviction waits for), else a new one."""
    with _LOCK:
        known = _RANGES.get(tensor.data_ptr())
        if known is not None and known.nbytes == _span_bytes(tensor):
            return known
    return _Range(tensor)


def _span_bytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return extent * t.element_size()


def _cuda(device) -> torch.device:
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else \
        torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"a residency budget is for a GPU, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.index >= torch.cuda.device_count():
        raise ValueError(f"{device} does not exist: this machine has "
                         f"{torch.cuda.device_count()} GPU(s)")
    if device.index not in _ENVIRONMENT_APPLIED:   # residency_limit_mb, once per GPU
        _ENVIRONMENT_APPLIED.add(device.index)
        limit = _C.residency_limit_from_environment()
        if limit and _BUDGET.limit(device.index) is None:
            _BUDGET.set_limit(device.index, limit)
    return device


def set_residency_limit(limit: Union[int, float, None], device=None) -> None:
    """The most bytes of streamed managed memory torch_uvm keeps on `device`
    (an int: bytes; a float in (0, 1]: a fraction of the managed memory cap;
    None: no budget). Modules given to :func:`offload`, batches from
    :func:`prefetching` and :func:`bring` stay within it: before more would
    arrive, the least recently used leave."""
    device = _cuda(device)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)):
            raise TypeError(f"the residency limit must be bytes (int), a fraction (float) or "
                            f"None, got {limit!r}")
        cap = _C.memory_cap()
        if isinstance(limit, float):
            if not 0.0 < limit <= 1.0:
                raise ValueError(f"a fractional residency limit must be in (0, 1], got {limit}")
            limit = int(limit * cap)
        if limit <= 0:
            raise ValueError(f"the residency limit must be positive, got {limit}")
        if limit > cap:
            raise ValueError(f"a residency limit of {limit} bytes is above the managed memory "
                             f"cap ({cap} bytes): raise the cap first (set_memory_cap) or "
                             f"choose a smaller limit")
    with _LOCK:
        _BUDGET.set_limit(device.index, limit)


def get_residency_limit(device=None) -> Optional[int]:
    """The residency budget of `device` in bytes, or None."""
    return _BUDGET.limit(_cuda(device).index)


def residency_stats(device=None) -> Dict[str, int]:
    """Bytes resident on `device` (current and peak) among the memory torch_uvm
    streams, bytes prefetched there, and evictions by mechanism."""
    return dict(_BUDGET.stats(_cuda(device).index))


def _wait_last_use(r: _Range) -> None:
    if r.last_use is not None:
        r.last_use.synchronize()


def _evict(steps, side: torch.cuda.Stream) -> None:
    for address, _, how in steps:
        r = _RANGES.get(address)
        if r is None:
            continue
        _wait_last_use(r)
        if how == "drop_copy":
            _C.advise(r.tensor, "unset_read_mostly", None)
            _C.advise(r.tensor, "read_mostly", None)
        else:
            _C.prefetch(r.tensor, torch.device("cpu"), side)
        r.device = None
        if not r.owned:
            _BUDGET.forget(address)
            del _RANGES[address]


def _bring(ranges: List[_Range], device: torch.device, stream: torch.cuda.Stream,
           written: bool = False) -> None:
    """Prefetch `ranges` to `device` on `stream`, evicting first what the
    budget says must leave."""
    with _LOCK:
        for r in ranges:
            _RANGES.setdefault(r.address, r)
            if r.device == device and _BUDGET.is_resident(device.index, r.address):
                _BUDGET.admit(device.index, r.address, r.nbytes, written)  # most recent
                continue
            _evict(_BUDGET.admit(device.index, r.address, r.nbytes, written), stream)
            _C.prefetch(r.tensor, device, stream)
            r.device = device


def _set_busy(ranges: List[_Range], busy: bool) -> None:
    with _LOCK:
        for r in ranges:
            _BUDGET.set_busy(r.address, busy)


def _release(ranges: List[_Range]) -> None:
    with _LOCK:
        for r in ranges:
            _BUDGET.forget(r.address)
            _RANGES.pop(r.address, None)


def forget_advice() -> None:
    """The memory may go back to the driver (empty_cache): advise anew."""
    with _LOCK:
        _ADVISED.clear()


def _advise_batches(ranges: List[_Range], device: torch.device) -> None:
    """Read-mostly, home on the CPU, for ranges not advised so already."""
    todo = [r for r in ranges if _ADVISED.get(r.address) != r.nbytes]
    _advise_streamed(todo, device)
    for r in todo:
        _ADVISED[r.address] = r.nbytes


def _advise_streamed(ranges: List[_Range], device: torch.device, in_place: bool = False) -> None:
    """Advice for ranges that stream: home on the CPU, and either read-mostly
    (a prefetch makes a GPU duplicate, dropped on eviction) or, `in_place`,
    mapped for `device` (kernels there read the CPU pages in place). Advice on
    populated pages costs about 0.1 ms per MiB, so it is set once per range,
    never per move."""
    for r in ranges:
        _C.advise(r.tensor, "preferred_location", torch.device("cpu"))
        # a reused block keeps the advice of the tensor that had it before
        if not in_place:
            _C.advise(r.tensor, "unset_accessed_by", device)
            _C.advise(r.tensor, "read_mostly", None)
        else:
            _C.advise(r.tensor, "unset_read_mostly", None)
            _C.advise(r.tensor, "accessed_by", device)


def _managed_tensors(obj) -> List[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj] if _C.is_managed(obj) else []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _managed_tensors(item)]
    return []


def _to_device(obj, device: torch.device):
    """`obj` with each managed tensor seen on `device` (same memory)."""
    if isinstance(obj, torch.Tensor):
        if _C.is_managed(obj) and obj.device != device:
            return _C.alias_on_device(obj, device)
        return obj
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj


def prefetching(iterable: Iterable, device=None, ahead: int = 1) -> Iterator:
    """Iterate `iterable` (batches of managed tensors: a managed tensor's
    slices, a DataLoader with UVM on) with each batch on `device`, the next
    `ahead` batches prefetched on a side stream while the current one is used,
    and old batches leaving under the residency budget. The yielded batch is
    the same memory seen on `device`, ready on the current stream."""
    if not isinstance(ahead, int) or ahead < 1:
        raise ValueError(f"ahead must be a positive int, got {ahead!r}")
    device = _cuda(device)
    side = torch.cuda.Stream(device)
    pending: List[tuple] = []          # (item, ranges, ready event)
    iterator = iter(iterable)

    def stage() -> bool:
        try:
            item = next(iterator)
        except StopIteration:
            return False
        ranges = [_range_for(t) for t in _managed_tensors(item)]
        _advise_batches(ranges, device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            _bring(ranges, device, side)
            ready = side.record_event()
        _set_busy(ranges, True)
        pending.append((item, ranges, ready))
        return True

    current: List[_Range] = []
    try:
        for _ in range(ahead + 1):
            if not stage():
                break
        while pending:
            item, current, ready = pending.pop(0)
            torch.cuda.current_stream(device).wait_event(ready)
            yield _to_device(item, device)
            done = torch.cuda.current_stream(device).record_event()
            for r in current:
                r.last_use = done
            _set_busy(current, False)
            current = []
            stage()
    finally:                          # also when the loop stopped early
        _set_busy(current, False)
        for _, ranges, _ in pending:
            _set_busy(ranges, False)


def bring(tensors, device=None, stream: Optional[torch.cuda.Stream] = None) -> None:
    """Prefetch managed `tensors` to `device` within its residency budget,
    ordered on `stream` (default: the current stream)."""
    device = _cuda(device)
    ranges = [_range_for(t) for t in _managed_tensors(tensors)]
    _advise_batches(ranges, device)   # so that leaving drops a copy, never migrates
    _bring(ranges, device, stream or torch.cuda.current_stream(device))


# --- modules --------------------------------------------------------------------

class _Unit:
    """A module with parameters or buffers of its own, streamed as one."""
    __slots__ = ("name", "module", "ranges", "nbytes", "ready", "resident")

    def __init__(self, name: str, module: torch.nn.Module, ranges: List[_Range]):
        self.name, self.module, self.ranges = name, module, ranges
        self.nbytes = sum(r.nbytes for r in ranges)
        self.ready: Optional[torch.cuda.Event] = None
        self.resident = False


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
        self._owns_limit = False
        self._advised = False

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
        if self.mode == "auto":
            small = _rows((args, kwargs)) <= IN_PLACE_MAX_ROWS
            self.mode = "in_place" if small and not torch.is_grad_enabled() else "prefetch"
        _advise_streamed(self._ranges(), self.device, in_place=self.mode == "in_place")

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
        room = self.budget - window
        for u in order:               # a resident prefix: it never leaves
            if u.nbytes <= room:
                room -= u.nbytes
                u.resident = True
            else:
                break
        streamed = [u for u in order if not u.resident]
        if not streamed:              # everything fits: nothing streams
            for u in order:
                u.resident = True
        for u in order:
            if u.resident:
                _bring(u.ranges, self.device, torch.cuda.current_stream(self.device))
                _set_busy(u.ranges, True)

    def _pre(self, unit: _Unit) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"torch_uvm: the offloaded module '{unit.name}' ran inside a CUDA "
                               "graph capture; streamed weights cannot be captured. Undo the "
                               "offload (or give it a budget that holds the whole model) first.")
        compute = torch.cuda.current_stream(self.device)
        if not self.learned:
            self.order.append(unit)
            if self.mode == "prefetch":
                _bring(unit.ranges, self.device, compute)
                _set_busy(unit.ranges, True)
            return
        if self.mode == "in_place":   # resident, or read where it is
            return
        if unit.ready is not None:
            compute.wait_event(unit.ready)
            unit.ready = None
        elif not unit.resident:
            _bring(unit.ranges, self.device, compute)
        _set_busy(unit.ranges, True)
        for u in self._upcoming(unit):   # the next `ahead` streamed units
            if u.ready is None:
                # No wait for the compute stream: what leaves for room was
                # waited for on the host (_evict), and u is not in use.
                with torch.cuda.stream(self.side):
                    _bring(u.ranges, self.device, self.side)
                    u.ready = self.side.record_event()
                _set_busy(u.ranges, True)        # until it has run

    def _upcoming(self, unit: _Unit) -> List[_Unit]:
        """The `ahead` streamed units that run after `unit`, wrapping round
        to the next forward."""
        i = self.order.index(unit)
        cyclic = self.order[i + 1:] + self.order[:i + 1]
        return [u for u in cyclic if not u.resident and u is not unit][:self.ahead]

    def _post(self, unit: _Unit) -> None:
        if self.mode == "in_place" and not unit.resident:
            return                    # read in place: nothing was brought
        done = torch.cuda.current_stream(self.device).record_event()
        for r in unit.ranges:
            r.last_use = done
        if not unit.resident or not self.learned:
            _set_busy(unit.ranges, False)

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
        for r in self._ranges():
            for advice in ("unset_read_mostly", "unset_accessed_by"):
                _C.advise(r.tensor, advice, self.device)
            _C.advise(r.tensor, "unset_preferred_location", None)
        for u in self.units:
            _release(u.ranges)
        with torch.no_grad():
            for (owner, name, kind), original in self._originals.items():
                current = getattr(owner, name)
                original.copy_(current.to(original.device))
                if kind == "param":
                    owner._parameters[name] = original
                else:
                    owner._buffers[name] = original
        if self._owns_limit:
            with _LOCK:
                _BUDGET.set_limit(self.device.index, None)
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
    limit = _BUDGET.limit(device.index)
    if limit is not None and budget > limit:
        raise ValueError(f"torch_uvm: a budget of {budget} bytes is above {device}'s residency "
                         f"limit ({limit} bytes): raise the limit (set_residency_limit) or "
                         f"lower the budget")
    # Nothing above changed the module; from here on, all of it is applied.
    originals, units, handles = {}, [], []
    shared: Dict[int, tuple] = {}     # id(tensor) -> (its replacement, _Range): tied weights
    with torch.no_grad():
        for name, m, own, _ in plan:
            ranges = []
            for tname, t, kind in own:
                if id(t) not in shared:
                    managed = t.detach() if _C.is_managed(t) else \
                        _C.manage_memory(t.detach().to("cpu"))
                    seen = _C.alias_on_device(managed, device) \
                        if managed.device != device else managed
                    if kind == "param":
                        seen = torch.nn.Parameter(seen, requires_grad=t.requires_grad)
                    shared[id(t)] = (seen, _Range(managed, owned=True))
                seen, r = shared[id(t)]
                originals[(m, tname, kind)] = t
                (m._parameters if kind == "param" else m._buffers)[tname] = seen
                if all(x is not r for x in ranges):
                    ranges.append(r)
            units.append(_Unit(name, m, ranges))
    handle = Offloaded(module, device, budget, ahead, mode, units, handles, originals)
    handles.append(module.register_forward_pre_hook(
        lambda _m, args, kwargs: handle._begin(args, kwargs), with_kwargs=True))
    for u in units:
        handles.append(u.module.register_forward_pre_hook(
            lambda _m, _a, u=u: handle._pre(u)))
        handles.append(u.module.register_forward_hook(
            lambda _m, _a, _o, u=u: handle._post(u)))
    handles.append(module.register_forward_hook(
        lambda _m, _a, _o: handle.finish_first_forward()))
    if limit is None:       # the budget becomes the device's residency limit
        with _LOCK:
            _BUDGET.set_limit(device.index, budget)
        handle._owns_limit = True
    module._torch_uvm_offloaded = handle
    return handle
