"""Activation offload: what autograd saves for backward leaves the GPU
during forward and comes back during backward, on copy streams of its own,
overlapped with compute.

    with torch_uvm.offload_activations():
        loss = model(batch)
    loss.backward()

What leaves: each CUDA tensor autograd saves of at least `min_bytes`, not a
parameter or other leaf that requires grad, nor a view of one (a weight is
already where its owner keeps it).
Where it goes: a home in pinned host memory, from PyTorch's caching host
allocator, so a step's homes are reused by the next step's.

Forward: after the op that saved it, the tensor is copied home on the send
stream. Until that copy ends it is held on the GPU (its memory could be
written again otherwise); at most `window` bytes are held so, and past
that, compute waits for the oldest copy. A tensor saved twice (the input
of q, k and v) goes home once.

Backward: a tensor still held is used where it is (those are let go when
backward ends). The others come back on the bring stream, `window` bytes
ahead of backward, in the reverse of the order forward saved them: when
backward asks for one, the ones forward saved before it are on their way.
A tensor brought back is held until its last use in that backward (one use
a time it was saved); the home stays until autograd frees the graph, so
``retain_graph`` backwards bring it again.

With a `budget`, the last saved tensors of a forward stay, up to that many
bytes (learnt from the forward before): backward needs them first, and only
the rest crosses the link.

So the activations' GPU memory is at most about two windows (one going,
one coming), the budget, and what stays anyway (small tensors,
parameters): a long sequence trains in the memory a short one needs, at the
link's speed where compute is shorter than the copies
(benchmarks/offload_activations.py).

Not inside a CUDA graph capture or torch.compile's tracing (saved tensors
stay on the GPU there); one backward at a time per context."""
from __future__ import annotations

import collections
import threading
import weakref
from typing import Dict, List, Optional

import torch

from .offload import _host_available

DEFAULT_MIN_BYTES = 1 << 20
DEFAULT_WINDOW = 512 << 20


class _Saved:
    """One saved tensor that went home."""
    __slots__ = ("seq", "nbytes", "device", "home", "sent", "gpu", "brought", "arrived",
                 "used_in", "uses", "left", "version", "__weakref__")

    def __init__(self, seq: int, t: torch.Tensor, home: torch.Tensor, sent: torch.cuda.Event):
        self.seq, self.nbytes, self.device = seq, _nbytes(t), t.device
        self.home, self.sent = home, sent
        self.gpu: Optional[torch.Tensor] = t            # held until its copy home ends
        self.brought: Optional[torch.Tensor] = None     # on the GPU again, not yet used
        self.arrived: Optional[torch.cuda.Event] = None
        self.used_in = -2                               # the last backward that used it
        self.uses = 1                                   # times saved (deduplicated)
        self.left = 0                                   # uses left in that backward
        self.version = t._version


class _Stayed:
    """One saved tensor the budget kept on the GPU (a record all the same,
    so that backward tells the context it ran)."""
    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor):
        self.t = t


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _is_weight(t: torch.Tensor) -> bool:
    """A parameter, or another leaf that requires grad (its owner holds it
    anyway), or a view of one."""
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def _tracing() -> bool:
    compiler = getattr(torch, "compiler", None)
    return (compiler is not None and hasattr(compiler, "is_compiling")
            and compiler.is_compiling())


def _graph_task() -> int:
    """The backward running now (-1 outside one)."""
    return torch._C._current_graph_task_id()


def _pinned_home(t: torch.Tensor) -> torch.Tensor:
    """A pinned host tensor shaped as `t` (its strides, where dense)."""
    try:
        return torch.empty_like(t, device="cpu", pin_memory=True)
    except RuntimeError as e:
        free = _host_available()
        raise torch.OutOfMemoryError(
            f"torch_uvm.offload_activations: cannot pin {_nbytes(t)} bytes of host memory for "
            f"a saved activation ({tuple(t.shape)}, {t.dtype}); the host has "
            f"{'an unknown amount' if free is None else f'{free} bytes'} available. Free host "
            f"memory, raise min_bytes, or checkpoint the model's layers so fewer activations "
            f"are saved. ({e})") from e


class offload_activations(torch.autograd.graph.saved_tensors_hooks):
    """Under this context, saved activations of at least `min_bytes` go to
    pinned host memory during forward and come back, `window` bytes ahead,
    during backward. The context can be entered again step after step.

    `min_bytes`: smaller saved tensors stay on the GPU (default 1 MiB).
    `window`: the bytes on their way in each direction, held on the GPU
    (default 512 MiB); larger overlaps more of the copies with compute,
    smaller holds less.
    `budget`: the bytes of saved activations that may stay on the GPU
    (default 0: all go). From the second forward on, the last ones forward
    saves stay, up to `budget` bytes: backward needs them first, so only the
    rest crosses the link, and its copies overlap compute at both ends. How
    many bytes a forward saves is learnt from the one before; a longer one
    keeps `budget` bytes at most all the same."""

    def __init__(self, min_bytes: int = DEFAULT_MIN_BYTES, window: int = DEFAULT_WINDOW,
                 budget: int = 0):
        for name, value in (("min_bytes", min_bytes), ("window", window), ("budget", budget)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"torch_uvm.offload_activations: {name} must be an int of "
                                 f"bytes, 0 or more; got {value!r}")
        self.min_bytes, self.window, self.budget = min_bytes, window, budget
        self._forward_bytes = 0    # offered this forward (since the last backward ended)
        self._stayed_bytes = 0     # of those, kept on the GPU by the budget
        self._last_forward_bytes: Optional[int] = None
        self._lock = threading.Lock()
        self._streams: Dict[torch.device, tuple] = {}      # device -> (send, bring)
        self._order: List["weakref.ref[_Saved]"] = []       # in the order forward saved them
        self._alive_at_prune = 0
        self._recent: Dict[int, tuple] = {}                 # id(tensor) -> (its ref, record's)
        self._in_flight: "collections.deque[_Saved]" = collections.deque()
        self._in_flight_bytes = 0
        self._ahead: "weakref.WeakSet[_Saved]" = weakref.WeakSet()   # brought, not yet used
        self._held: "weakref.WeakSet[_Saved]" = weakref.WeakSet()    # brought, uses left
        self._ahead_bytes = 0
        self._task = -2            # the backward the bring-ahead follows
        self._cursor = 0           # below it, nothing this backward has brought yet
        self._stats = collections.Counter()
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "offload_activations":
        super().__enter__()
        return self

    STATS = ("sent", "sent_bytes", "deduplicated", "kept", "kept_bytes", "stayed",
             "stayed_bytes", "waited",
             "used_in_place", "brought_ahead", "brought_late", "brought_bytes")

    def stats(self) -> Dict[str, int]:
        """What moved since the context was made: `sent` / `sent_bytes` (saved
        tensors that went home), `deduplicated` (saved again, sent once),
        `kept` / `kept_bytes` (saved tensors left on the GPU: small, weights,
        not CUDA), `stayed` / `stayed_bytes` (large enough to go, kept by the
        budget), `waited` (forward waited for a copy home: the window was
        full), `used_in_place` (backward used one still held), `brought_ahead`
        and `brought_late` (brought back before backward asked, or when it
        asked) and `brought_bytes`. A tensor saved several times is brought
        once a backward and held until its last use there."""
        return {k: self._stats[k] for k in self.STATS}

    # ------------------------------------------------------------ forward

    def _keeps(self, t: torch.Tensor) -> bool:
        return (type(t) is not torch.Tensor or not t.is_cuda or _nbytes(t) < self.min_bytes
                or _is_weight(t) or torch.cuda.is_current_stream_capturing() or _tracing())

    def _pack(self, t: torch.Tensor):
        if self._keeps(t):
            self._stats["kept"] += 1
            self._stats["kept_bytes"] += _nbytes(t)
            return t
        with self._lock:
            key = id(t)
            hit = self._recent.get(key)
            if hit is not None and hit[0]() is t:
                rec = hit[1]()
                if isinstance(rec, _Stayed) or (rec is not None and rec.version == t._version):
                    self._stats["deduplicated"] += 1
                    if isinstance(rec, _Saved):
                        rec.uses += 1
                    return rec
            n = _nbytes(t)
            self._forward_bytes += n
            if self._stays(n):
                self._stayed_bytes += n
                self._stats["stayed"] += 1
                self._stats["stayed_bytes"] += n
                out = _Stayed(t)
            else:
                out = self._send(t)
            self._recent[key] = (weakref.ref(t, lambda r, k=key, d=self._recent:
                                             d.pop(k) if d.get(k, (None,))[0] is r else None),
                                 weakref.ref(out))
            return out

    def _stays(self, n: int) -> bool:
        """Whether a tensor of `n` bytes, the last saved so far, is in the
        tail of the forward that the budget keeps."""
        last = self._last_forward_bytes
        return (self.budget > 0 and last is not None
                and self._forward_bytes > last - self.budget
                and self._stayed_bytes + n <= self.budget)

    def _streams_for(self, device: torch.device) -> tuple:
        if device not in self._streams:
            self._streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return self._streams[device]

    def _send(self, t: torch.Tensor) -> _Saved:
        send = self._streams_for(t.device)[0]
        home = _pinned_home(t)
        send.wait_stream(torch.cuda.current_stream(t.device))           # the op that made it runs first
        with torch.cuda.stream(send):
            home.copy_(t, non_blocking=True)
            sent = torch.cuda.Event()
            sent.record(send)
        self._prune_order()
        rec = _Saved(len(self._order), t, home, sent)
        self._order.append(weakref.ref(rec))
        self._in_flight.append(rec)
        self._in_flight_bytes += rec.nbytes
        self._stats["sent"] += 1
        self._stats["sent_bytes"] += rec.nbytes
        self._release_sent(keep=self.window)
        return rec

    def _release_sent(self, keep: int) -> None:
        """Lets go of the GPU copies of tensors whose copy home ended; while
        more than `keep` bytes are still held, compute waits for the oldest
        copy."""
        while self._in_flight:
            rec = self._in_flight[0]
            if not rec.sent.query():
                if self._in_flight_bytes <= keep:
                    break
                torch.cuda.current_stream(rec.device).wait_event(rec.sent)
                self._stats["waited"] += 1
            self._in_flight.popleft()
            self._in_flight_bytes -= rec.nbytes
            rec.gpu = None

    def _prune_order(self) -> None:
        """Drops the records autograd freed from the order, now and then."""
        if len(self._order) < 2 * self._alive_at_prune + 64:
            return
        live = [rec for rec in (ref() for ref in self._order) if rec is not None]
        for i, rec in enumerate(live):
            rec.seq = i
        self._order = [weakref.ref(rec) for rec in live]
        self._alive_at_prune = len(live)
        self._cursor = min(self._cursor, len(live))

    # ----------------------------------------------------------- backward

    def _unpack(self, saved):
        if isinstance(saved, torch.Tensor):
            return saved
        with self._lock:
            task = _graph_task()
            if task != self._task:
                self._begin_backward(task)
            if isinstance(saved, _Stayed):
                return saved.t
            rec: _Saved = saved
            compute = torch.cuda.current_stream(rec.device)
            if rec.used_in != task:
                rec.used_in, rec.left = task, rec.uses
            rec.left -= 1
            if rec.gpu is not None:                      # still on its way home
                t = rec.gpu
                self._stats["used_in_place"] += 1
            else:
                if rec.brought is None:
                    self._bring(rec)
                    self._stats["brought_late"] += 1
                elif rec in self._ahead:
                    self._stats["brought_ahead"] += 1
                    self._ahead.discard(rec)
                    self._ahead_bytes -= rec.nbytes
                t = rec.brought
                if rec.left <= 0:                        # its last use in this backward
                    rec.brought = None
                    self._held.discard(rec)
                compute.wait_event(rec.arrived)
                t.record_stream(compute)                 # freed by compute, reused after it
            self._cursor = min(self._cursor, rec.seq)
            self._bring_ahead(task)
        return t

    def _begin_backward(self, task: int) -> None:
        self._task = task
        self._cursor = len(self._order)
        self._ahead_bytes = sum(rec.nbytes for rec in self._ahead)
        if task >= 0:    # at its end, let go of what it left held
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _bring(self, rec: _Saved) -> None:
        bring = self._streams_for(rec.device)[1]
        bring.wait_event(rec.sent)                        # its home is written
        with torch.cuda.stream(bring):                    # memory of the bring stream's pool
            t = torch.empty_strided(rec.home.size(), rec.home.stride(), dtype=rec.home.dtype,
                                    device=rec.device)
            t.copy_(rec.home, non_blocking=True)
            rec.arrived = torch.cuda.Event()
            rec.arrived.record(bring)
        rec.brought = t
        self._held.add(rec)
        self._stats["brought_bytes"] += rec.nbytes

    def _bring_ahead(self, task: int) -> None:
        """Brings the tensors forward saved before the one just used, the
        latest first, until `window` bytes are brought and unused."""
        i = self._cursor - 1
        while i >= 0 and self._ahead_bytes < self.window:
            rec = self._order[i]()
            i -= 1
            if rec is None or rec.gpu is not None or rec.brought is not None \
                    or rec.used_in == task:
                continue
            self._bring(rec)
            self._ahead.add(rec)
            self._ahead_bytes += rec.nbytes
        self._cursor = i + 1

    def _end_backward(self) -> None:
        with self._lock:
            for rec in list(self._held):   # uses that did not come (record_stream guards them)
                rec.brought = None
            self._held = weakref.WeakSet()
            self._ahead = weakref.WeakSet()
            self._ahead_bytes = 0
            self._task = -2
            self._release_sent(keep=0)        # what forward left on its way home
            if self._forward_bytes:
                self._last_forward_bytes = self._forward_bytes
            self._forward_bytes = self._stayed_bytes = 0
