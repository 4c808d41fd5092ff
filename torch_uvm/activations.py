"""Activation offload: what autograd saves for backward leaves the GPU
during forward and comes back during backward, on copy streams of its own,
overlapped with compute.

    with torch_uvm.offload_activations():
        loss = model(batch)
    loss.backward()

What leaves: each plain CUDA tensor autograd saves of at least `min_bytes`,
dense (no expanded or overlapping strides), not a parameter or other leaf
that requires grad, nor a view of one (a weight is already where its owner
keeps it). Where it goes: a home in pinned host memory, from PyTorch's
caching host allocator, so a step's homes are reused by the next step's.

Forward: after the op that saved it, the tensor is copied home on the send
stream. Until that copy ends it is held on the GPU; at most `window` bytes
are held so, and past that, compute waits for the oldest copy. A tensor
saved twice (the input of q, k and v) goes home once. With a `budget`, the
latest saved tensors stay on the GPU, up to that many bytes; when a new one
would pass it, the oldest of them goes home: so the last ones of a forward,
which backward needs first, stay, whatever the forward's length.

Backward: a tensor still on the GPU (held, or kept by the budget) is used
where it is. The others come back on the bring stream, `window` bytes ahead
of backward, in the reverse of the order forward saved them: when backward
asks for one, the ones forward saved before it are on their way. A tensor
brought back is held until its last use in that backward (one use a time
it was saved); the home stays until autograd frees the graph, so
``retain_graph`` backwards bring it again. The window also counts the
brought tensors whose last use the GPU has yet to run (backward's thread
runs ahead of the GPU, and their memory is not free until it has): past
it, that thread waits for the GPU, so the brought tensors' memory stays
about one window however far ahead it ran (beyond it: the tensors of the
node running, brought tensors with uses left, and one device's waits
holding up another's: one queue serves every device).

A saved tensor changed in place before backward is an error, as without
hooks (PyTorch stops checking once hooks save tensors: this context checks).

The activations' GPU memory is then about two windows (one going, one
coming) and the budget, a tensor or two beyond them, and what stays anyway
(small tensors, parameters): a long sequence trains in the memory a short
one needs, at the link's speed where compute is shorter than the copies
(benchmarks/offload_activations.py).

Not inside a CUDA graph capture or torch.compile's tracing (saved tensors
stay on the GPU there); one backward at a time per context (a backward
inside another, as reentrant checkpointing's when backward runs inside the
context, is right, and brings again what the inner one let go)."""
from __future__ import annotations

import collections
import threading
import weakref
from typing import Deque, Dict, List, Optional, Tuple

import torch

from .host_memory import host_available
from .sizes import parse_bytes

DEFAULT_MIN_BYTES = 1 << 20
DEFAULT_WINDOW = 512 << 20


def _dead():
    return None


class _Saved:
    """One saved tensor the context took: on the GPU (`gpu`) until it is
    sent and its copy home ends, or while the budget keeps it (`home` None)."""
    __slots__ = ("seq", "nbytes", "device", "home", "sent", "gpu", "source", "version",
                 "brought", "arrived", "used_in", "uses", "left", "__weakref__")

    def __init__(self, seq: int, t: torch.Tensor):
        self.seq, self.nbytes, self.device = seq, _nbytes(t), t.device
        self.home: Optional[torch.Tensor] = None        # made when it is sent
        self.sent: Optional[torch.cuda.Event] = None    # its copy home ended
        self.gpu: Optional[torch.Tensor] = t            # until its copy home ends
        self.source = weakref.ref(t)                    # to see a change in place
        self.version = t._version
        self.brought: Optional[torch.Tensor] = None     # on the GPU again
        self.arrived: Optional[torch.cuda.Event] = None
        self.used_in = -2                               # the last backward that used it
        self.uses = 1                                   # times saved (deduplicated)
        self.left = 0                                   # uses left in that backward


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill its span of memory once each, in some
    order of its dimensions (no expanded, overlapping or skipped elements):
    then a copy of the same strides takes its bytes and no more."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _is_weight(t: torch.Tensor) -> bool:
    """A parameter, or another leaf that requires grad (its owner holds it
    anyway), or a view of one."""
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def _tracing() -> bool:
    compiler = getattr(torch, "compiler", None)
    return (compiler is not None and hasattr(compiler, "is_compiling")
            and compiler.is_compiling())


def _current_node():
    """The autograd node running now (None outside one)."""
    return torch._C._current_autograd_node()


def _graph_task() -> int:
    """The backward running now (-1 outside one)."""
    return torch._C._current_graph_task_id()


def _pinned_home(t: torch.Tensor) -> torch.Tensor:
    """A pinned host tensor shaped as `t`, with its strides (`t` is dense)."""
    try:
        return torch.empty_like(t, device="cpu", pin_memory=True)
    except RuntimeError as e:
        free = host_available()
        raise torch.OutOfMemoryError(
            f"torch_uvm.offload_activations: cannot pin {_nbytes(t)} bytes of host memory for "
            f"a saved activation ({tuple(t.shape)}, {t.dtype}); the host has "
            f"{'an unknown amount' if free is None else f'{free} bytes'} available. Free host "
            f"memory, raise min_bytes, or checkpoint the model's layers so fewer activations "
            f"are saved. ({e})") from e


def _check_unchanged(rec: _Saved) -> None:
    source = rec.source()
    if source is not None and source._version != rec.version:
        raise RuntimeError(
            f"one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{source.type()} {list(source.shape)}] is at version "
            f"{source._version}; expected version {rec.version} instead "
            f"(torch_uvm.offload_activations saved it)")


class offload_activations(torch.autograd.graph.saved_tensors_hooks):
    """Under this context, saved activations of at least `min_bytes` go to
    pinned host memory during forward and come back, `window` bytes ahead,
    during backward. The context can be entered again step after step.

    `min_bytes`: smaller saved tensors stay on the GPU (default 1 MiB).
    `window`: the bytes on their way in each direction, held on the GPU
    (default 512 MiB); larger overlaps more of the copies with compute,
    smaller holds less.
    `budget`: the bytes of saved activations that may stay on the GPU
    (default 0: all go): the latest saved stay, and past the budget the
    oldest of them go home; so a forward's last ones stay, backward needs
    them first, and only the rest crosses the link."""

    STATS = ("sent", "sent_bytes", "deduplicated", "kept", "kept_bytes", "stayed",
             "stayed_bytes", "waited", "used_in_place", "brought_ahead", "brought_late",
             "brought_bytes", "waited_release")

    def __init__(self, min_bytes: int = DEFAULT_MIN_BYTES, window: int = DEFAULT_WINDOW,
                 budget: int = 0):
        min_bytes, window, budget = (
            parse_bytes(v, f"offload_activations' {name}")
            for name, v in (("min_bytes", min_bytes), ("window", window), ("budget", budget)))
        for name, value in (("min_bytes", min_bytes), ("window", window), ("budget", budget)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"torch_uvm.offload_activations: {name} must be an int of "
                                 f"bytes, 0 or more; got {value!r}")
        self.min_bytes, self.window, self.budget = min_bytes, window, budget
        self._lock = threading.Lock()
        self._streams: Dict[torch.device, tuple] = {}      # device -> (send, bring)
        self._order: List = []                              # weakrefs, in the order saved
        self._alive_at_prune = 0
        self._recent: Dict[int, tuple] = {}                 # id(tensor) -> (its ref, record's)
        self._kept: Deque[Tuple["weakref.ref[_Saved]", int]] = collections.deque()  # budget's
        self._kept_bytes = 0
        self._in_flight: Deque[_Saved] = collections.deque()
        self._in_flight_bytes = 0
        self._ahead: "weakref.WeakSet[_Saved]" = weakref.WeakSet()   # brought, not yet used
        self._held: "weakref.WeakSet[_Saved]" = weakref.WeakSet()    # brought, uses left
        self._ahead_bytes = 0
        # Brought tensors past their last use: compute may not have run that
        # use yet (the CPU runs ahead of the GPU), and until it has, their
        # memory is not the bring stream's to reuse. `_unmarked`: (device, the
        # autograd node that unpacked them, bytes), their use not yet launched
        # (a node unpacks all its saved tensors before its kernels run);
        # `_releasing`: (an event on compute after their use, bytes), oldest first.
        self._unmarked: List[Tuple[torch.device, object, int]] = []
        self._releasing: Deque[Tuple[torch.cuda.Event, int]] = collections.deque()
        self._releasing_bytes = 0
        self._task = -2            # the backward the bring-ahead follows
        self._cursor = 0           # below it, nothing this backward has brought yet
        self._stats = collections.Counter()
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "offload_activations":
        super().__enter__()
        return self

    def stats(self) -> Dict[str, int]:
        """What moved since the context was made: `sent` / `sent_bytes` (saved
        tensors that went home), `deduplicated` (saved again, taken once),
        `kept` / `kept_bytes` (saved tensors left as they are: small, not
        dense, weights, not CUDA), `stayed` / `stayed_bytes` (large enough to
        go, kept on the GPU by the budget until backward used them),
        `waited` (forward waited for a copy home: the window was full),
        `used_in_place` (backward used one still on the GPU, the budget's
        among them), `brought_ahead` and `brought_late` (brought back
        before backward asked, or when it asked) and `brought_bytes`,
        `waited_release` (the events backward's thread waited on, each
        compute's end with some brought tensors: the window was full). A tensor saved several times
        is brought once a backward and held until its last use there."""
        return {k: self._stats[k] for k in self.STATS}

    # ------------------------------------------------------------ forward

    def _keeps(self, t: torch.Tensor) -> bool:
        return (type(t) is not torch.Tensor or not t.is_cuda or _nbytes(t) < self.min_bytes
                or not _dense(t) or _is_weight(t)
                or torch.cuda.is_current_stream_capturing() or _tracing())

    def _pack(self, t: torch.Tensor):
        if self._keeps(t):
            self._stats["kept"] += 1
            self._stats["kept_bytes"] += _nbytes(t)
            return t
        with self._lock:
            key = id(t)
            hit = self._recent.get(key)
            rec = hit[1]() if hit is not None and hit[0]() is t else None
            if rec is not None and rec.version == t._version:
                self._stats["deduplicated"] += 1
                rec.uses += 1
                self._order[rec.seq] = _dead       # backward meets it at its last save
                self._enter_order(rec)
                return rec
            rec = _Saved(0, t)
            self._enter_order(rec)
            self._recent[key] = (weakref.ref(t, lambda r, k=key, d=self._recent:
                                             d.pop(k) if d.get(k, (None,))[0] is r else None),
                                 weakref.ref(rec))
            if self.budget:
                self._kept.append((weakref.ref(rec), rec.nbytes))
                self._kept_bytes += rec.nbytes
                self._send_past_budget()
            else:
                self._send(rec)
            return rec

    def _enter_order(self, rec: _Saved) -> None:
        self._prune_order()
        rec.seq = len(self._order)
        self._order.append(weakref.ref(rec))

    def _send_past_budget(self) -> None:
        """Sends the oldest of the budget's tensors while they pass it."""
        while self._kept and self._kept_bytes > self.budget:
            ref, nbytes = self._kept.popleft()
            self._kept_bytes -= nbytes
            rec = ref()
            if rec is not None and rec.home is None and rec.gpu is not None:
                self._send(rec)

    def _streams_for(self, device: torch.device) -> tuple:
        if device not in self._streams:
            self._streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return self._streams[device]

    def _send(self, rec: _Saved) -> None:
        t = rec.gpu
        send = self._streams_for(t.device)[0]
        rec.home = _pinned_home(t)
        send.wait_stream(torch.cuda.current_stream(t.device))   # the op that made it first
        with torch.cuda.stream(send):
            rec.home.copy_(t, non_blocking=True)
            rec.sent = torch.cuda.Event()
            rec.sent.record(send)
        t.record_stream(send)            # whichever stream frees it, not reused before the copy
        self._in_flight.append(rec)
        self._in_flight_bytes += rec.nbytes
        self._stats["sent"] += 1
        self._stats["sent_bytes"] += rec.nbytes
        self._release_sent(keep=self.window)

    def _release_sent(self, keep: int) -> None:
        """Lets go of the GPU copies of tensors whose copy home ended; while
        more than `keep` bytes are still held, compute waits for the oldest
        copy (record_stream keeps the memory safe; the wait keeps it few)."""
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
        rec: _Saved = saved
        _check_unchanged(rec)
        with self._lock:
            task = _graph_task()
            if task < 0:                 # read outside a backward: this one alone
                return self._one(rec)
            if task != self._task:
                self._begin_backward(task)
            self._mark_released()
            first = rec.used_in != task
            if first:
                rec.used_in, rec.left = task, rec.uses
            rec.left -= 1
            t = self._one(rec, first)
            self._cursor = min(self._cursor, rec.seq)
            self._bring_ahead(task)
        return t

    def _one(self, rec: _Saved, first: bool = True) -> torch.Tensor:
        """The tensor of `rec` on the GPU for compute's use now."""
        compute = torch.cuda.current_stream(rec.device)
        if rec.gpu is not None:                      # still there: on its way, or kept
            if first:
                self._stats["used_in_place"] += 1
                if rec.home is None:
                    self._stats["stayed"] += 1
                    self._stats["stayed_bytes"] += rec.nbytes
            t = rec.gpu
            if rec.left <= 0 and rec.home is not None:   # its last use: let it go home
                self._drop_in_flight(rec)
            return t
        if rec.brought is None:
            self._wait_released(rec.nbytes)
            self._bring(rec)
            self._stats["brought_late"] += 1
        elif rec in self._ahead:
            self._stats["brought_ahead"] += 1
            self._ahead.discard(rec)
            self._ahead_bytes -= rec.nbytes
        t = rec.brought
        if rec.left <= 0:                            # its last use in this backward
            rec.brought = None
            self._held.discard(rec)
            self._unmarked.append((rec.device, _current_node(), rec.nbytes))
        compute.wait_event(rec.arrived)
        t.record_stream(compute)                     # freed by compute, reused after it
        return t

    def _drop_in_flight(self, rec: _Saved) -> None:
        try:
            self._in_flight.remove(rec)
        except ValueError:
            return
        self._in_flight_bytes -= rec.nbytes
        rec.gpu = None

    def _begin_backward(self, task: int) -> None:
        self._task = task
        self._cursor = len(self._order)
        self._ahead_bytes = sum(rec.nbytes for rec in self._ahead)
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

    def _mark_released(self, every: bool = False) -> None:
        """At an unpack of another node than the one that released them (or,
        `every`, at the backward's end): the uses of the released tensors are
        launched, and an event on compute marks their end. Then forgets the
        marks compute has passed."""
        node = _current_node()
        left = []
        for device, by, nbytes in self._unmarked:
            if not every and by is node:
                left.append((device, by, nbytes))   # (its node's kernels are still to come)
                continue
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(device))
            self._releasing.append((done, nbytes))
            self._releasing_bytes += nbytes
        self._unmarked = left
        while self._releasing and self._releasing[0][0].query():
            self._releasing_bytes -= self._releasing.popleft()[1]

    def _wait_released(self, nbytes: int) -> None:
        """Before a bring of `nbytes`: while it, the brought tensors unused
        and those compute has yet to finish with would hold more than
        `window` bytes, the CPU waits for the oldest of the last (it runs
        ahead of the GPU: without the wait, each bring would take new
        memory)."""
        while self._releasing and self._releasing_bytes + self._ahead_bytes + nbytes > self.window:
            done, freed = self._releasing.popleft()
            self._releasing_bytes -= freed       # (first: a failed wait leaves no count behind)
            self._stats["waited_release"] += 1
            done.synchronize()

    def _bring_ahead(self, task: int) -> None:
        """Brings the tensors forward saved before the one just used, the
        latest first, until `window` bytes are brought and unused (each
        after the used ones make room: _wait_released)."""
        i = self._cursor - 1
        while i >= 0 and self._ahead_bytes < self.window:
            rec = self._order[i]()
            i -= 1
            if rec is None or rec.gpu is not None or rec.brought is not None \
                    or rec.used_in == task:
                continue
            self._wait_released(rec.nbytes)
            self._bring(rec)
            self._ahead.add(rec)
            self._ahead_bytes += rec.nbytes
        self._cursor = i + 1

    def _end_backward(self) -> None:
        with self._lock:
            self._mark_released(every=True)
            for rec in list(self._held):   # uses that did not come (record_stream guards them)
                rec.brought = None
            self._held = weakref.WeakSet()
            self._ahead = weakref.WeakSet()
            self._ahead_bytes = 0
            self._task = -2
            self._release_sent(keep=0)        # what forward left on its way home
