"""Larger than the GPU: the residency budget, and how ranges arrive on a GPU
and leave it (prefetch, read in place, drop a copy, migrate), for batches
(`prefetching`, `bring`) and for offloaded modules (offload.py).

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
* a written range migrates back to the CPU (a read-mostly one is copied
  home, then its GPU copy dropped);
* a range whose tensor died (a gradient set to None) is forgotten, never
  migrated: its memory goes back to the allocator's cache;
* before a range leaves, the host waits for the last kernels that used it.
"""
from __future__ import annotations

import gc
import threading
import weakref
from typing import Dict, Iterable, Iterator, List, Optional, Union

import torch

from . import _C

_BUDGET = _C.residency_budget()
_LOCK = threading.RLock()
_RANGES: Dict[int, "_Range"] = {}       # address -> what is streamed there
# Ranges advised read-mostly with their home on the CPU (address -> bytes), so
# a batch streamed again is not advised again: advice on populated pages costs
# about 0.1 ms per MiB, five times its prefetch. Cleared by empty_cache, which
# may hand the memory back to the driver.
_ADVISED: Dict[int, int] = {}
_DISCARDED: Dict[int, List[int]] = {}   # device -> [count, bytes] of dead ranges forgotten
_DIED: List[int] = []                   # addresses of tracked tensors that died, to sweep
_LEASES: set = set()                    # the _Lease of every offload not undone
_ENDED: List["_Lease"] = []             # leases of offloads collected without undo, to end


class _Lease:
    """What an offloaded module holds on its GPU: its ranges (in the budget,
    with their advice) and, if its budget became the GPU's limit, that limit.
    undo() ends it; so does the sweep after the collector took an offload
    that was dropped without undo (its finalizer only notes it)."""
    __slots__ = ("device", "budget", "name", "ranges", "owns_limit")

    def __init__(self, device: torch.device, budget: int, name: str, ranges: List["_Range"]):
        self.device, self.budget, self.name, self.ranges = device, budget, name, ranges
        self.owns_limit = False


class _Range:
    """The bytes of one managed tensor that torch_uvm streams (a slice of a
    larger tensor streams on its own). `owned`: a range of an offloaded
    module, which keeps it; other ranges (batches) are let go once they left
    the GPU, so streaming holds no batch past its eviction. `alive`: for a
    tensor the user may drop (a gradient), whether it still exists."""
    __slots__ = ("tensor", "address", "nbytes", "last_use", "device", "owned", "read_mostly",
                 "alive")

    def __init__(self, tensor: torch.Tensor, owned: bool = False, track: bool = False):
        self.tensor = tensor.detach()
        self.address = tensor.data_ptr()
        self.nbytes = _span_bytes(tensor)
        self.last_use: Optional[torch.cuda.Event] = None
        self.device: Optional[torch.device] = None
        self.owned = owned
        self.read_mostly = False
        # the callback only notes the address: _sweep_dead does the rest
        self.alive = weakref.ref(tensor, lambda _, a=self.address, note=_DIED.append: note(a)) \
            if track else None


def _range_for(tensor: torch.Tensor, track: bool = False) -> _Range:
    """The one _Range of `tensor`'s bytes: the registered one while they are
    streamed (so its last use is the one eviction waits for), else a new one
    (`track`: that notices when `tensor` dies)."""
    with _LOCK:
        known = _RANGES.get(tensor.data_ptr())
        if known is not None and known.nbytes == _span_bytes(tensor) and \
                (known.alive is None or known.alive() is tensor):
            return known
    return _Range(tensor, track=track)


def _span_bytes(t: torch.Tensor) -> int:
    """The bytes `t`'s elements span: what a prefetch of it moves."""
    return _C.span_bytes(t)


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
    return device


def set_residency_limit(limit: Union[int, float, None], device=None) -> None:
    """The most bytes of streamed managed memory torch_uvm keeps on `device`
    (an int: bytes; a float in (0, 1]: a fraction of the managed memory cap;
    None: no budget). Modules given to :func:`offload`, batches from
    :func:`prefetching` and :func:`bring` stay within it: before more would
    arrive, the least recently used leave. A limit below the budget of a
    module offloaded on `device` (or None) is refused: undo the offload
    first."""
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
        _check_offloads_fit(device, limit)
        _BUDGET.set_limit(device.index, limit)
        for lease in _LEASES:       # the limit is the user's now: undo leaves it
            if lease.device == device:
                lease.owns_limit = False


def _check_offloads_fit(device: torch.device, limit: Optional[int]) -> None:
    """Refuse a limit that a live offload on `device` would not stream under."""
    def misfits():
        return [x for x in _LEASES
                if x.device == device and (limit is None or x.budget > limit)]
    if not misfits():
        return
    _collect_dropped_offloads()
    left = misfits()
    if left:
        x = max(left, key=lambda x: x.budget)
        what = "no residency limit" if limit is None else f"a residency limit of {limit} bytes"
        raise ValueError(f"torch_uvm: {what} on {device} would let the offloaded "
                         f"{x.name} (budget {x.budget} bytes) stream without its budget: "
                         f"undo() the offload first"
                         f"{'' if limit is None else ', or offload it with a smaller budget'}")


def _collect_dropped_offloads() -> None:
    """An offloaded module dropped without undo is in a reference cycle with
    its hooks: collect it and give back what it held, before refusing a limit
    or a budget because of it."""
    gc.collect()
    with _LOCK:
        _sweep_dead()


def _end_lease(lease: _Lease) -> None:
    """Give back what an offload held: its ranges leave the budget with their
    advice unset, and a limit it set goes to another offload on the GPU that
    streams under it, or goes. The caller made sure no kernel uses them."""
    with _LOCK:
        if lease not in _LEASES:
            return
        _LEASES.discard(lease)
        for r in lease.ranges:
            for advice in ("unset_read_mostly", "unset_accessed_by"):
                _C.advise(r.tensor, advice, lease.device)
            _C.advise(r.tensor, "unset_preferred_location", None)
        _release(lease.ranges)
        if lease.owns_limit:
            heir = next((x for x in _LEASES if x.device == lease.device), None)
            if heir is None:
                _BUDGET.set_limit(lease.device.index, None)
            else:              # its budget fits the limit: it keeps it, and owns it now
                heir.owns_limit = True


def get_residency_limit(device=None) -> Optional[int]:
    """The residency budget of `device` in bytes, or None."""
    device = _cuda(device)
    with _LOCK:
        _sweep_dead()           # a dropped offload's limit goes with it
        return _BUDGET.limit(device.index)


def residency_stats(device=None) -> Dict[str, int]:
    """Bytes resident on `device` (current and peak) among the memory torch_uvm
    streams, bytes prefetched there, and evictions by mechanism (discard: a
    dead tensor's range forgotten, nothing moved)."""
    index = _cuda(device).index
    with _LOCK:
        _sweep_dead()
        stats = dict(_BUDGET.stats(index))
    count, nbytes = _DISCARDED.get(index, [0, 0])
    stats.update({"evictions.discard": count, "evicted_bytes.discard": nbytes})
    return stats


def _wait_last_use(r: _Range) -> None:
    if r.last_use is not None:
        r.last_use.synchronize()


def _evict(steps, side: torch.cuda.Stream) -> None:
    for address, _, how in steps:
        r = _RANGES.get(address)
        if r is None:
            continue
        _wait_last_use(r)
        if how == "drop_copy" and r.read_mostly:
            _drop_copy(r)
        else:
            # (also a range not read-mostly: there is no second copy to fall back on)
            _C.prefetch(r.tensor, torch.device("cpu"), side)
            if r.read_mostly:         # the prefetch made a CPU copy: drop the GPU's
                side.synchronize()
                _drop_copy(r)
        r.device = None
        if not r.owned:
            _BUDGET.forget(address)
            del _RANGES[address]


def evict(device=None) -> None:
    """Let every streamed range on `device` that is not in use leave it now
    (a copy dropped, or migrated home if written), and let go of the batches
    torch_uvm still held. Resident units of an offloaded module stay."""
    device = _cuda(device)
    with _LOCK:
        _sweep_dead()
        for r in [r for r in _RANGES.values() if r.device == device]:
            if _BUDGET.is_busy(r.address):
                continue
            how = "drop_copy" if r.read_mostly else "migrate"
            _BUDGET.forget(r.address)
            _RANGES[r.address] = r    # _evict looks it up, and lets go of a batch
            _evict([(r.address, r.nbytes, how)], torch.cuda.current_stream(device))
            if r.owned:
                _RANGES.pop(r.address, None)


def _drop_copy(r: _Range) -> None:
    """Unsetting read-mostly collapses the duplicates to the preferred
    location (the CPU), where a copy is: the GPU's is dropped, nothing moves."""
    _C.advise(r.tensor, "unset_read_mostly", None)
    _C.advise(r.tensor, "read_mostly", None)


def _sweep_dead() -> None:
    """Forget the ranges whose tensor died: nothing to keep, nothing to move.
    Only the addresses noted dead are looked at, not every range. End the
    leases of offloads collected without undo (outside a graph capture:
    it waits for the GPU, then advises)."""
    while _ENDED and not torch.cuda.is_current_stream_capturing():
        lease = _ENDED.pop()
        torch.cuda.synchronize(lease.device)   # kernels queued may still read them
        _end_lease(lease)
    while _DIED:
        r = _RANGES.get(_DIED.pop())
        if r is None or r.alive is None or r.alive() is not None:
            continue      # never registered, or a live tensor took the address
        if r.device is not None and _BUDGET.is_resident(r.device.index, r.address):
            counts = _DISCARDED.setdefault(r.device.index, [0, 0])
            counts[0] += 1
            counts[1] += r.nbytes
        _BUDGET.forget(r.address)
        del _RANGES[r.address]


def _admit_written(ranges: List[_Range], device: torch.device, stream: torch.cuda.Stream) -> None:
    """`ranges` were just written on `device` (gradients, optimizer states):
    count them, written, and make room for them."""
    with _LOCK:
        _sweep_dead()
        for r in ranges:
            _RANGES.setdefault(r.address, r)
            _evict(_BUDGET.admit(device.index, r.address, r.nbytes, True), stream)
            _BUDGET.mark_written(r.address)
            r.device = device


def _bring(ranges: List[_Range], device: torch.device, stream: torch.cuda.Stream,
           written: bool = False) -> None:
    """Prefetch `ranges` to `device` on `stream`, evicting first what the
    budget says must leave."""
    with _LOCK:
        _sweep_dead()
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
    for r in ranges:
        _ADVISED[r.address] = r.nbytes
        r.read_mostly = True


def _advise_streamed(ranges: List[_Range], device: torch.device, in_place: bool = False,
                     read_mostly: bool = True) -> None:
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
            _C.advise(r.tensor, "read_mostly" if read_mostly else "unset_read_mostly", None)
            r.read_mostly = read_mostly
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
