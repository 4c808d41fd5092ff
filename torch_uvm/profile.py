"""See what moves (issue 22): what torch_uvm's residency policy did while a
block of code ran.

    with torch_uvm.profile() as p:
        train_step()
    print(p.summary())            # per submodule / tensor: bytes in, out by how
    p.plot("residency.png")       # resident bytes over time against budgets and limits
    p.to_json("residency.json")   # the same data
    p.export_chrome_trace("uvm.json", merge_with="torch_trace.json")   # beside the kernels

Every range that arrived on a GPU or left it is an event: ``arrive`` (brought
to the GPU), ``adopt`` (made on the GPU and counted, a gradient), ``drop``
(a clean copy let go), ``write_home`` (written data sent home), ``discard``
(died: a gradient set to None) and ``forget`` (left the books without an
eviction), with its bytes, its share (the offload's, or ``batches``), the
name of the submodule or tensor it belongs to, and the bytes resident in the
share and on the GPU after it. Times are the host's when the policy decided
(the copy runs on a stream right after). The record is core/residency's
(csrc/core/residency_timeline.h); it costs nothing outside a profile.

The driver's own counters are recorded beside it (``counters=True``, through
CUPTI's unified-memory activity records, csrc/runtime/um_counters.h): every
migration of managed memory each way with its cause (``prefetch``, ``fault``,
``speculative``, ``eviction``), every GPU and CPU page fault, thrashing and
throttling, each named by the tensor, submodule or allocation it hit
(``names=``, then the policy's labels, then the allocator's blocks):
``driver_events()``, ``driver_totals()``, ``moved(tensor)``,
``gpu_faults(tensor)``. They count managed memory only: an offloaded model's
pinned homes and device slots move by copy engine, which torch.profiler's
trace shows as copies. CUPTI's buffers are one per process, so while
torch.profiler (or Nsight Systems) records, the counters are not recorded and
a warning says so; the timeline still is.

torch_uvm's own work also shows in torch.profiler traces (ranges named
``torch_uvm::bring <submodule>``, ...): see docs/seeing-what-moves.md, "Seeing what
moves".
"""
from __future__ import annotations

import json
import time
import warnings
from contextlib import contextmanager
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch

from . import _C

#: The event kinds, in the order the summary shows them.
KINDS = ("arrive", "adopt", "drop", "write_home", "discard", "forget")
#: The driver's totals per name (driver_totals), in the order the summary shows them.
DRIVER_COLUMNS = ("to_gpu_bytes", "prefetched_bytes", "to_host_bytes", "evicted_bytes",
                  "gpu_faults", "cpu_faults", "thrashing", "throttling", "migration_s")

Names = Union[torch.nn.Module, Dict[str, torch.Tensor], None]
#: The driver reports a fault at the base of the page that faulted (4 KiB pages).
FAULT_PAGE = 4096


def _span(t: torch.Tensor) -> Tuple[int, int]:
    """The bytes a tensor covers, (address, bytes): its own for a contiguous
    tensor (a batch split from a larger one is named apart), else its
    storage's."""
    if t.is_contiguous():
        return t.data_ptr(), t.numel() * t.element_size()
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _named_spans(names: Names) -> List[Tuple[int, int, str]]:
    if names is None:
        return []
    if isinstance(names, torch.nn.Module):
        pairs = list(names.named_parameters(remove_duplicate=True)) + \
            list(names.named_buffers(remove_duplicate=True))
    elif isinstance(names, dict):
        pairs = list(names.items())
    else:
        raise TypeError(f"torch_uvm.profile: names must be a module or a dict of name -> tensor, "
                        f"got {type(names).__name__}")
    out = []
    for name, t in pairs:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"torch_uvm.profile: names[{name!r}] is a {type(t).__name__}, "
                            f"not a tensor")
        address, nbytes = _span(t)
        if nbytes:
            out.append((address, nbytes, str(name)))
    return out


def torch_profiler_recording() -> bool:
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except AttributeError:
        return False

_running: Optional["Profile"] = None   # the profile recording now
_warned_unarmed = False                 # said once: memory before the counters is not counted


class Profile:
    """What :func:`profile` recorded (filled when the ``with`` block ends)."""

    def __init__(self, capacity: int, counters: bool = True, names: Names = None):
        self.capacity = capacity
        self.events: List[dict] = []
        self.dropped = 0
        self.counters = counters
        self._names = _named_spans(names)
        #: Why the driver's counters were not recorded (None: they were, or not asked).
        self.counters_missing: Optional[str] = None
        self.driver: List[dict] = []                        # the driver's events
        self.driver_dropped = 0
        self._counting = False                              # this profile started the counters
        self.holders: Dict[int, str] = {0: "batches"}       # share -> who holds it
        self.budgets: Dict[str, int] = {}                   # "cuda:N holder" -> its budget
        self.limits: Dict[int, Optional[int]] = {}          # GPU -> its residency limit
        self._start_ns = self._start_epoch_ns = 0

    def _note_shares(self, devices) -> None:
        budget = _C.residency_budget()
        for device in devices:
            for share, holder, nbytes, _ in budget.shares(device):
                self.holders[share] = holder
                self.budgets[f"cuda:{device} {holder}"] = nbytes
            self.limits[device] = budget.limit(device)

    def __enter__(self) -> "Profile":
        global _running
        if _running is not None:
            raise RuntimeError("torch_uvm.profile: a profile is already recording; one at a time")
        self._note_shares(range(max(torch.cuda.device_count(), 1)))
        if self.counters:
            self._start_counters()
        self._start_ns = time.monotonic_ns()     # the same clock as the events'
        self._start_epoch_ns = time.time_ns()    # torch.profiler's traces count from the epoch
        _C.residency_budget().start_timeline(self.capacity)
        _running = self
        return self

    def _start_counters(self) -> None:
        if not torch.cuda.is_available():
            self.counters_missing = "no CUDA device"      # nothing to count: no warning
            return
        if torch_profiler_recording():
            why = ("torch.profiler is recording, and CUPTI's activity buffers are one per "
                   "process: profile the driver's counters in a block outside it")
        else:
            why = _C.um_counters_start()
        if why:
            self.counters_missing = why
            warnings.warn(f"torch_uvm.profile: the driver's counters (migrations, faults) are not "
                          f"recorded: {why}. The residency timeline is.", stacklevel=3)
            return
        self._counting = True
        global _warned_unarmed
        unarmed = _C.driver_counters_not_armed() if _C.allocator_created() else ""
        if unarmed and not _warned_unarmed:
            _warned_unarmed = True
            warnings.warn("torch_uvm.profile: the driver counts only managed memory allocated "
                          "after its counters were first enabled, and they were not when "
                          f"torch_uvm's allocator started ({unarmed}): memory allocated before "
                          "this profile is not counted", stacklevel=3)

    def name(self, tensor: torch.Tensor, name: str) -> "Profile":
        """Names the memory of `tensor` in the driver's events (before the
        block ends; names given first win)."""
        address, nbytes = _span(tensor)
        self._names.append((address, nbytes, name))
        return self

    def __exit__(self, *exc) -> None:
        global _running
        events, self.dropped = _C.residency_budget().take_timeline()
        _running = None
        if self._counting:
            self._counting = False
            self._stop_counters(events)
        self._note_shares(sorted({e["device"] for e in events} | set(self.limits)))
        for e in events:
            e["time_s"] = (e.pop("time_ns") - self._start_ns) / 1e9
            e["holder"] = self.holders.get(e["share"], f"share {e['share']}")
        self.events = events
        if self.dropped:
            warnings.warn(f"torch_uvm.profile: {self.dropped} early events were dropped (the "
                          f"record holds {self.capacity}); pass a larger capacity")

    def _stop_counters(self, timeline: List[dict]) -> None:
        labels = [(e["address"], e["bytes"], e["label"]) for e in timeline if e["label"]]
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()      # the migrations of the block are done
        finally:                              # (a sticky CUDA error must not leave CUPTI on)
            events, self.driver_dropped, missing, other = _C.um_counters_stop(self._names + labels)
        if other:
            warnings.warn(f"torch_uvm.profile: CUPTI handed torch_uvm {other} records of another "
                          "tool (torch.profiler in a schedule's warmup, Nsight Systems): that "
                          "tool's trace misses them", stacklevel=3)
        if missing:
            warnings.warn(f"torch_uvm.profile: this GPU does not report: {missing}", stacklevel=3)
        for e in events:
            e["time_s"] = (e.pop("start_ns") - self._start_ns) / 1e9
            e["end_s"] = (e.pop("end_ns") - self._start_ns) / 1e9
        self.driver = events
        if self.driver_dropped:
            warnings.warn(f"torch_uvm.profile: CUPTI dropped {self.driver_dropped} of the "
                          f"driver's records", stacklevel=3)

    def _require_counters(self) -> None:
        if self.counters_missing is not None or not self.counters:
            raise RuntimeError("torch_uvm.profile: the driver's counters were not recorded ("
                               f"{self.counters_missing or 'counters=False'})")

    def driver_events(self) -> List[dict]:
        """The driver's unified-memory events, in the order it reported them:
        kind (``to_gpu``, ``to_host``, ``gpu_fault``, ``cpu_fault``,
        ``thrashing``, ``throttling``, ``remote_map``, ``gpu_to_gpu``), cause
        of a migration (``prefetch``, ``fault``, ``speculative``,
        ``eviction``, ``access_counters``, ``unknown``), address, value
        (bytes, or a count of faults), time_s and end_s (from the start of the
        block), device (-1: the CPU) and pieces: [(name, bytes or count)] of
        what it hit ("" where nothing named the memory)."""
        return list(self.driver)

    def driver_totals(self) -> Dict[str, Dict[str, float]]:
        """Per name (tensor, submodule, allocation; "(unnamed)"): bytes the
        driver moved to the GPU (and of those, by prefetch) and to the host
        (and of those, evicted), GPU and CPU faults, thrashing and throttling
        events, and seconds of migration."""
        out: Dict[str, Dict[str, float]] = {}
        for e in self.driver:
            whole = max(e["value"], 1)
            for name, part in e["pieces"]:
                row = out.setdefault(name or "(unnamed)", {k: 0 for k in DRIVER_COLUMNS})
                kind = e["kind"]
                if kind == "to_gpu":
                    row["to_gpu_bytes"] += part
                    row["prefetched_bytes"] += part if e["cause"] == "prefetch" else 0
                elif kind == "to_host":
                    row["to_host_bytes"] += part
                    row["evicted_bytes"] += part if e["cause"] == "eviction" else 0
                elif kind in ("gpu_fault", "cpu_fault"):
                    row[kind + "s"] += part
                elif kind in ("thrashing", "throttling"):
                    row[kind] += 1
                if kind in ("to_gpu", "to_host"):
                    row["migration_s"] += (e["end_s"] - e["time_s"]) * part / whole
        return out

    def moved(self, tensor: torch.Tensor) -> Dict[str, int]:
        """What the driver did to `tensor`'s memory in the block: bytes to the
        GPU (``to_gpu``, of which ``prefetched``), to the host (``to_host``),
        and faults (``gpu_faults``, ``cpu_faults``). Raises if the counters
        were not recorded."""
        self._require_counters()
        lo, nbytes = _span(tensor)
        hi = lo + nbytes
        out = {"to_gpu": 0, "prefetched": 0, "to_host": 0, "gpu_faults": 0, "cpu_faults": 0}
        for e in self.driver:
            a, kind = e["address"], e["kind"]
            if kind in ("to_gpu", "to_host"):
                part = max(0, min(hi, a + e["value"]) - max(lo, a))
                out[kind] += part
                out["prefetched"] += part if kind == "to_gpu" and e["cause"] == "prefetch" else 0
            elif kind in ("gpu_fault", "cpu_fault") and a < hi and a + FAULT_PAGE > lo:
                out[kind + "s"] += e["value"]     # at its page's base: any overlap counts
        return out

    def gpu_faults(self, tensor: Optional[torch.Tensor] = None) -> int:
        """GPU page faults (fault groups, as the driver counts them) on
        `tensor`'s memory, or anywhere if None."""
        if tensor is not None:
            return self.moved(tensor)["gpu_faults"]
        self._require_counters()
        return sum(e["value"] for e in self.driver if e["kind"] == "gpu_fault")

    def timeline(self) -> List[dict]:
        """The events, oldest first: time_s (from the start of the block),
        device, share, holder, label, kind, bytes, share_resident and
        device_resident (bytes after the event), address."""
        return list(self.events)

    def totals(self) -> Dict[Tuple[int, str, str], Dict[str, int]]:
        """Bytes per (device, holder, label) and kind."""
        out: Dict[Tuple[int, str, str], Dict[str, int]] = {}
        for e in self.events:
            row = out.setdefault((e["device"], e["holder"], e["label"] or "(unnamed)"),
                                 {k: 0 for k in KINDS})
            row[e["kind"]] += e["bytes"]
        return out

    def peaks(self) -> Dict[str, int]:
        """The most bytes resident at once, per share (``cuda:N holder``) and
        per GPU (``cuda:N``), over the block."""
        out: Dict[str, int] = {}
        for e in self.events:
            share = f"cuda:{e['device']} {e['holder']}"
            out[share] = max(out.get(share, 0), e["share_resident"])
            gpu = f"cuda:{e['device']}"
            out[gpu] = max(out.get(gpu, 0), e["device_resident"])
        return out

    def summary(self) -> str:
        """A table: per device, holder and submodule (or tensor), the MiB that
        arrived, were adopted, and left by each way; then the peaks."""
        mib = 1 << 20
        lines = ["| device | holder | name | " + " | ".join(f"{k} MiB" for k in KINDS) + " |",
                 "|---|---|---|" + "---|" * len(KINDS)]
        for (device, holder, label), row in sorted(self.totals().items()):
            lines.append(f"| cuda:{device} | {holder} | {label} | "
                         + " | ".join(f"{row[k] / mib:.1f}" for k in KINDS) + " |")
        lines.append("")
        lines.append("| resident at most | MiB | budget or limit, MiB |")
        lines.append("|---|---|---|")
        for name, peak in sorted(self.peaks().items()):
            bound = self.budgets.get(name) if " " in name else self.limits.get(int(name[5:]))
            lines.append(f"| {name} | {peak / mib:.1f} | "
                         f"{'' if bound is None else f'{bound / mib:.1f}'} |")
        if self.dropped:
            lines.append(f"\n({self.dropped} early events dropped)")
        lines.append("")
        if self.counters_missing is not None:
            lines.append(f"The driver's counters were not recorded: {self.counters_missing}")
        elif self.counters:
            lines.append("What the driver moved (managed memory; CUPTI):")
            lines.append("| name | to GPU MiB | of which prefetched | to host MiB | of which evicted "
                         "| GPU faults | CPU faults | thrashing | throttling | migrating ms |")
            lines.append("|---|---|---|---|---|---|---|---|---|---|")
            for name, row in sorted(self.driver_totals().items()):
                lines.append(f"| {name} | {row['to_gpu_bytes'] / mib:.1f} | "
                             f"{row['prefetched_bytes'] / mib:.1f} | {row['to_host_bytes'] / mib:.1f} | "
                             f"{row['evicted_bytes'] / mib:.1f} | {row['gpu_faults']} | "
                             f"{row['cpu_faults']} | {row['thrashing']} | {row['throttling']} | "
                             f"{row['migration_s'] * 1e3:.2f} |")
        return "\n".join(lines)

    def to_json(self, path: str) -> None:
        """The timeline, totals, peaks, budgets and limits as JSON."""
        with open(path, "w") as f:
            json.dump({"events": self.events, "dropped": self.dropped,
                       "holders": {str(k): v for k, v in self.holders.items()},
                       "budgets": self.budgets,
                       "limits": {f"cuda:{d}": v for d, v in self.limits.items()},
                       "peaks": self.peaks(),
                       "totals": [{"device": d, "holder": h, "label": l, **row}
                                  for (d, h, l), row in self.totals().items()],
                       "counters_missing": self.counters_missing if self.counters else "counters=False",
                       "driver_events": self.driver,
                       "driver_dropped": self.driver_dropped,
                       "driver_totals": self.driver_totals()}, f, indent=1)

    def export_chrome_trace(self, path: str, merge_with: Optional[str] = None) -> None:
        """The timeline as a Chrome/Perfetto trace: a counter track of resident
        MiB per GPU and per share, and an instant event for each departure
        (named by how it left and what). `merge_with`: a trace that
        torch.profiler exported (``prof.export_chrome_trace``) of the same
        run; the events are added to it on its clock, so they line up with
        its kernels and copies."""
        base_ns = self._start_epoch_ns
        data = {"traceEvents": [], "displayTimeUnit": "ms"}
        if merge_with is not None:
            with open(merge_with) as f:
                data = json.load(f)
            base_ns = int(data.get("baseTimeNanoseconds", 0))
        offset_us = (self._start_epoch_ns - base_ns) / 1e3
        ours = []
        for e in self.events:
            ts = offset_us + e["time_s"] * 1e6
            gpu = f"cuda:{e['device']}"
            ours.append({"ph": "C", "name": f"torch_uvm resident MiB, {gpu}", "pid": "torch_uvm",
                         "tid": 0, "ts": ts, "args": {"MiB": e["device_resident"] / (1 << 20)}})
            ours.append({"ph": "C", "name": f"torch_uvm resident MiB, {gpu} {e['holder']}",
                         "pid": "torch_uvm", "tid": 0, "ts": ts,
                         "args": {"MiB": e["share_resident"] / (1 << 20)}})
            if e["kind"] not in ("arrive", "adopt"):
                ours.append({"ph": "i", "s": "p", "name": f"torch_uvm {e['kind']} {e['label']}",
                             "pid": "torch_uvm", "tid": 0, "ts": ts,
                             "args": {"bytes": e["bytes"], "holder": e["holder"]}})
        ours += self._driver_trace(offset_us)
        data["traceEvents"] = list(data.get("traceEvents", [])) + ours
        with open(path, "w") as f:
            json.dump(data, f)

    def _driver_trace(self, offset_us: float) -> List[dict]:
        """The driver's events as trace events: migrations as spans on a row
        per direction, faults and notices as instants, named by what they hit."""
        if not self.driver:
            return []
        rows = {"to_gpu": 1, "to_host": 2, "gpu_to_gpu": 3}
        out = [{"ph": "M", "name": "thread_name", "pid": "torch_uvm driver (CUPTI)", "tid": tid,
                "args": {"name": name}}
               for name, tid in (("migrations to GPU", 1), ("migrations to host", 2),
                                 ("GPU to GPU", 3), ("faults and notices", 4))]
        for e in self.driver:
            names = ", ".join(sorted({n or "(unnamed)" for n, _ in e["pieces"]}))
            base = {"pid": "torch_uvm driver (CUPTI)", "ts": offset_us + e["time_s"] * 1e6,
                    "args": {"address": hex(e["address"]), "value": e["value"],
                             "cause": e["cause"], "device": e["device"], "names": names}}
            if e["kind"] in rows:
                out.append({**base, "ph": "X", "tid": rows[e["kind"]],
                            "dur": max(e["end_s"] - e["time_s"], 0) * 1e6,
                            "name": f"{e['kind']} {e['cause']} {names}"})
            else:
                out.append({**base, "ph": "i", "s": "t", "tid": 4, "name": f"{e['kind']} {names}"})
        return out

    def plot(self, path: str) -> None:
        """A PNG: resident bytes per GPU and per share over the block (steps at
        each event), each share's budget and the GPU's limit as dashed lines,
        and the evictions marked by how they left."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise RuntimeError("torch_uvm.profile().plot needs matplotlib: pip install "
                               "matplotlib (or use to_json)") from e
        mib = 1 << 20
        moves = [e for e in self.driver if e["kind"] in ("to_gpu", "to_host")]
        if moves:
            fig, (ax, low) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 1.4]})
            for kind in ("to_gpu", "to_host"):
                mine = sorted((e for e in moves if e["kind"] == kind), key=lambda e: e["end_s"])
                total, xs, ys = 0, [0.0], [0.0]
                for e in mine:
                    total += e["value"]
                    xs.append(e["end_s"])
                    ys.append(total / mib)
                low.step(xs, ys, where="post", label=f"driver migrated {kind.replace('_', ' ')}")
            faults = [e for e in self.driver if e["kind"] == "gpu_fault"]
            if faults:
                low.scatter([e["time_s"] for e in faults], [0] * len(faults), marker="|",
                            color="red", label=f"GPU faults ({sum(e['value'] for e in faults)})")
            low.set_ylabel("MiB, cumulative")
            low.legend(fontsize=7, loc="upper left")
        else:
            fig, ax = plt.subplots(figsize=(9, 4.5))
        devices = sorted({e["device"] for e in self.events})
        for device in devices:
            mine = [e for e in self.events if e["device"] == device]
            ax.step([e["time_s"] for e in mine], [e["device_resident"] / mib for e in mine],
                    where="post", lw=2, label=f"cuda:{device} resident")
            for share in sorted({e["share"] for e in mine}):
                theirs = [e for e in mine if e["share"] == share]
                name = self.holders.get(share, str(share))
                ax.step([e["time_s"] for e in theirs],
                        [e["share_resident"] / mib for e in theirs], where="post", lw=1,
                        label=f"  {name}")
                if f"cuda:{device} {name}" in self.budgets:
                    ax.axhline(self.budgets[f"cuda:{device} {name}"] / mib, ls="--", lw=1,
                               color="gray")
            if self.limits.get(device):
                ax.axhline(self.limits[device] / mib, ls="--", lw=1.5, color="k",
                           label=f"cuda:{device} limit")
        for kind, marker in (("drop", "x"), ("write_home", "v"), ("discard", ".")):
            hits = [e for e in self.events if e["kind"] == kind]
            if hits:
                ax.scatter([e["time_s"] for e in hits], [e["share_resident"] / mib for e in hits],
                           marker=marker, s=16, label=kind, zorder=3)
        (low if moves else ax).set_xlabel(
            "seconds from the start of the profile (host time of each decision)")
        ax.set_ylabel("MiB resident")
        ax.set_title("what torch_uvm kept on the GPU (budgets dashed)")
        ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def profile(capacity: int = 1 << 20, counters: bool = True, names: Names = None) -> Profile:
    """Record what the residency policy does inside a ``with`` block, and
    what the driver moved: see the module's doc. `capacity`: the most
    timeline events kept (the oldest go first, with a warning). `counters`:
    record the driver's unified-memory counters too (a warning says why
    where they cannot be). `names`: a module (its parameters and buffers by
    their names) or a dict of name -> tensor, to name the driver's events."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"torch_uvm.profile: capacity must be a positive int, got {capacity!r}")
    if not isinstance(counters, bool):
        raise TypeError(f"torch_uvm.profile: counters must be True or False, got {counters!r}")
    return Profile(capacity, counters, names)


@contextmanager
def expect_no_gpu_faults(*tensors: torch.Tensor):
    """Raises AssertionError if the GPU work queued in the block page-faulted
    on the memory of `tensors` (any managed memory, if none given): the test
    of a prefetch, which never changes data. RuntimeError where the driver's
    counters cannot be recorded (so a test cannot pass without checking)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"torch_uvm.expect_no_gpu_faults: expected tensors, got "
                            f"{type(t).__name__}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = profile(names={f"tensor {i}": t for i, t in enumerate(tensors)})
        with p:
            yield p
    p._require_counters()
    if p.driver_dropped:
        raise RuntimeError(f"torch_uvm.expect_no_gpu_faults: CUPTI dropped {p.driver_dropped} of "
                           f"the driver's records, so the block cannot be checked")
    faults = {i: p.gpu_faults(t) for i, t in enumerate(tensors)} if tensors else \
        {"any": p.gpu_faults()}
    hit = {k: v for k, v in faults.items() if v}
    if hit:
        where = ", ".join(f"tensor {k}: {v}" if k != "any" else f"{v} faults" for k, v in hit.items())
        raise AssertionError(f"torch_uvm.expect_no_gpu_faults: the GPU page-faulted on managed "
                             f"memory ({where}); a prefetch is missing or came too late")
