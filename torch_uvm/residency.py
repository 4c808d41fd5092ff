"""Larger than the GPU: the residency budgets, and how batches arrive on a GPU
and leave it (`prefetching`, `bring`, `evict`). Offloaded modules stream
through their own share of the budget (offload.py, torch/stream_executor.h).

The policy (what stays, what leaves and how) is core/residency.h's
ResidencyBudget. A GPU has an optional limit (set_residency_limit), and each
offloaded module a share of its own (its budget): shares never take from
each other, add up to at most the limit (or, without one, the managed memory
cap), and batches get what the limit leaves over them.

Batches are the user's own managed tensors, so they move as the same memory:
* a batch brought to a GPU is prefetched there on a side stream, and the
  compute stream waits for it before the kernels that read it;
* it is advised ``read_mostly`` with its preferred location on the CPU, so
  the GPU holds a read-only duplicate, and it leaves by dropping that
  duplicate (unset read-mostly collapses it to the CPU copy): nothing is
  copied back; a batch the user wrote migrates home;
* a batch whose tensor died is forgotten, never migrated.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Dict, Iterable, Iterator, List, Optional, Union

import torch

from . import _C
from .profile import torch_profiler_recording
from .sizes import bytes_or_fraction

_BUDGET = _C.residency_budget()
_LOCK = threading.RLock()
_RANGES: Dict[int, "_Range"] = {}       # address -> what is streamed there
# Ranges advised read-mostly with their home on the CPU (address -> bytes), so
# a batch streamed again is not advised again: advice on populated pages costs
# about 0.1 ms per MiB, five times its prefetch. Cleared by empty_cache, which
# may hand the memory back to the driver.
_ADVISED: Dict[int, int] = {}
_LEASES: set = set()                    # the _Lease of every offload not undone


class _Lease:
    """What an offloaded module holds on its GPU: its share of the budget
    (and, through its executor, the slots in it). undo() ends it; so does
    the finalizer of an offload dropped without undo (its executor, dying
    with it, gives the slots back once the streams that used them pass)."""
    __slots__ = ("device", "share", "executor", "__weakref__")

    def __init__(self, device: torch.device, share: int):
        self.device, self.share = device, share
        self.executor = None


def open_lease(device: torch.device, budget: int, name: str) -> _Lease:
    """A share of `budget` bytes on `device`, refused (ValueError naming who
    holds the GPU) if it does not fit beside the others. An offload dropped
    without undo may still hold one until collected: collect, then retry."""
    def attempt():
        return _BUDGET.open_share(device.index, budget, name, _C.memory_cap())
    try:
        share = attempt()
    except ValueError:
        gc.collect()
        share = attempt()
    lease = _Lease(device, share)
    _LEASES.add(lease)
    return lease


def end_lease(lease: _Lease) -> None:
    """Give back an offload's share: closed first, forgotten after, so an
    exception in between leaves it to be ended again. Safe from a finalizer:
    no Python lock is taken."""
    if lease in _LEASES:
        _BUDGET.close_share(lease.share)
        _LEASES.discard(lease)


class _Range:
    """The bytes of one managed tensor streamed as a batch (a slice of a
    larger tensor streams on its own). Held while torch_uvm streams it, let
    go once it left the GPU, so streaming holds no batch past its eviction."""
    __slots__ = ("tensor", "address", "nbytes", "last_use", "device", "read_mostly")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach()
        self.address = tensor.data_ptr()
        self.nbytes = span_bytes(tensor)
        self.last_use: Optional[torch.cuda.Event] = None
        self.device: Optional[torch.device] = None
        self.read_mostly = False


def _range_for(tensor: torch.Tensor) -> _Range:
    """The one _Range of `tensor`'s bytes: the registered one while they are
    streamed (so its last use is the one eviction waits for), else a new one."""
    with _LOCK:
        known = _RANGES.get(tensor.data_ptr())
        if known is not None and known.nbytes == span_bytes(tensor):
            return known
    return _Range(tensor)


def span_bytes(t: torch.Tensor) -> int:
    """The bytes `t`'s elements span: what a prefetch of it moves."""
    return _C.span_bytes(t)


def cuda_device(device) -> torch.device:
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else \
        torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"a residency budget is for a GPU, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.index >= torch.cuda.device_count():
        raise ValueError(f"{device} does not exist: this machine has "
                         f"{torch.cuda.device_count()} GPU(s)")
    return device


def set_residency_limit(limit: Union[int, float, str, None], device=None) -> None:
    """The most bytes of streamed managed memory torch_uvm keeps on `device`
    (an int: bytes, or a size such as ``"20GiB"``, sizes.py; a float in
    (0, 1]: a fraction of the managed memory cap;
    None: no limit). It bounds the sum of the budgets of the modules
    offloaded on `device` (each streams within its own); batches from
    :func:`prefetching` and :func:`bring` get what is left: before more
    would arrive, the least recently used leave. A limit below the offloads'
    budgets is refused, naming them: undo one first."""
    limit = bytes_or_fraction(limit, "residency limit", _C.memory_cap)
    device = cuda_device(device)
    if limit is not None:
        cap = _C.memory_cap()
        if limit > cap:
            raise ValueError(f"a residency limit of {limit} bytes is above the managed memory "
                             f"cap ({cap} bytes): raise the cap first (set_memory_cap) or "
                             f"choose a smaller limit")
    try:
        _BUDGET.set_limit(device.index, limit)
    except ValueError:              # below the offloads' budgets: one may be dropped
        gc.collect()
        _BUDGET.set_limit(device.index, limit)


def get_residency_limit(device=None) -> Optional[int]:
    """The residency limit of `device` in bytes, or None."""
    return _BUDGET.limit(cuda_device(device).index)


def residency_shares(device=None) -> List[Dict[str, object]]:
    """Who streams on `device` within a share of its own (each offloaded
    module): its name, budget and bytes resident now."""
    return [{"holder": holder, "budget": budget, "resident_bytes": resident}
            for _, holder, budget, resident in _BUDGET.shares(cuda_device(device).index)]


def residency_stats(device=None) -> Dict[str, int]:
    """Bytes resident on `device` (current and peak) among the memory torch_uvm
    streams (batches and every offload's share), bytes brought there, and
    evictions by how they left: drop (a clean GPU copy let go), write_home
    (written data copied home) and discard (a dead tensor's range
    forgotten, nothing moved)."""
    return dict(_BUDGET.stats(cuda_device(device).index))


def _wait_last_use(r: _Range) -> None:
    if r.last_use is not None:
        r.last_use.synchronize()


def _traced(what: str, nbytes: int):
    """A range "torch_uvm::<what> <bytes>" in a running torch.profiler trace
    (and NVTX under emit_nvtx), around the prefetches and advice it holds,
    which carry their bytes and stream; nothing when no profiler runs."""
    if not torch_profiler_recording():
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"torch_uvm::{what} {nbytes} bytes")


def _evict(steps, side: torch.cuda.Stream) -> None:
    for address, _, how in steps:
        r = _RANGES.get(address)
        if r is None:
            continue
        _wait_last_use(r)
        if how == "drop" and r.read_mostly:
            with _traced("drop", r.nbytes):
                _drop_copy(r)
        else:
            # (also a range not read-mostly: there is no second copy to fall back on)
            with _traced("write_home", r.nbytes):
                _C.prefetch(r.tensor, torch.device("cpu"), side)
                if r.read_mostly:     # the prefetch made a CPU copy: drop the GPU's
                    side.synchronize()
                    _drop_copy(r)
        r.device = None
        if _RANGES.get(address) is r:
            del _RANGES[address]


def evict(device=None) -> None:
    """Let everything streamed on `device` that is not in use leave it now
    (a clean copy dropped, written data sent home), and let go of the
    batches torch_uvm still held. Resident units of offloaded modules stay."""
    device = cuda_device(device)
    with _LOCK:
        for r in [r for r in _RANGES.values() if r.device == device]:
            if _BUDGET.is_busy(r.address):
                continue
            how = _BUDGET.evict(r.address) or "drop"
            _evict([(r.address, r.nbytes, how)], torch.cuda.current_stream(device))
        for lease in list(_LEASES):
            if lease.device == device and lease.executor is not None:
                lease.executor.evict_unused()


def _drop_copy(r: _Range) -> None:
    """Unsetting read-mostly collapses the duplicates to the preferred
    location (the CPU), where a copy is: the GPU's is dropped, nothing moves."""
    _C.advise(r.tensor, "unset_read_mostly", None)
    _C.advise(r.tensor, "read_mostly", None)


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
            with _traced("bring", r.nbytes):
                _C.prefetch(r.tensor, device, stream)
            r.device = device


def _set_busy(ranges: List[_Range], busy: bool) -> None:
    with _LOCK:
        for r in ranges:
            _BUDGET.set_busy(r.address, busy)


def forget_advice() -> None:
    """The memory may go back to the driver (empty_cache): advise anew."""
    with _LOCK:
        _ADVISED.clear()


def _advise_batches(ranges: List[_Range], device: torch.device) -> None:
    """Read-mostly, home on the CPU (a prefetch makes a GPU duplicate,
    dropped on eviction), for ranges not advised so already. Advice on
    populated pages costs about 0.1 ms per MiB, so it is set once per range,
    never per move."""
    for r in ranges:
        if _ADVISED.get(r.address) != r.nbytes:
            _C.advise(r.tensor, "preferred_location", torch.device("cpu"))
            # a reused block keeps the advice of the tensor that had it before
            _C.advise(r.tensor, "unset_accessed_by", device)
            _C.advise(r.tensor, "read_mostly", None)
            _ADVISED[r.address] = r.nbytes
        r.read_mostly = True


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
    device = cuda_device(device)
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
    device = cuda_device(device)
    ranges = [_range_for(t) for t in _managed_tensors(tensors)]
    _advise_batches(ranges, device)   # so that leaving drops a copy, never migrates
    _bring(ranges, device, stream or torch.cuda.current_stream(device))
