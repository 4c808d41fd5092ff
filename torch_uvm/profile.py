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

torch_uvm's own work also shows in torch.profiler traces (ranges named
``torch_uvm::bring <submodule>``, ...): see docs/guide.md, "Seeing what
moves". The driver's counters (migrations and faults, through CUPTI) are not
recorded yet.
"""
from __future__ import annotations

import json
import time
import warnings
from typing import Dict, List, Optional, Tuple

import torch

from . import _C

#: The event kinds, in the order the summary shows them.
KINDS = ("arrive", "adopt", "drop", "write_home", "discard", "forget")

_running: Optional["Profile"] = None   # the profile recording now


class Profile:
    """What :func:`profile` recorded (filled when the ``with`` block ends)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.events: List[dict] = []
        self.dropped = 0
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
        self._start_ns = time.monotonic_ns()     # the same clock as the events'
        self._start_epoch_ns = time.time_ns()    # torch.profiler's traces count from the epoch
        _C.residency_budget().start_timeline(self.capacity)
        _running = self
        return self

    def __exit__(self, *exc) -> None:
        global _running
        events, self.dropped = _C.residency_budget().take_timeline()
        _running = None
        self._note_shares(sorted({e["device"] for e in events} | set(self.limits)))
        for e in events:
            e["time_s"] = (e.pop("time_ns") - self._start_ns) / 1e9
            e["holder"] = self.holders.get(e["share"], f"share {e['share']}")
        self.events = events
        if self.dropped:
            warnings.warn(f"torch_uvm.profile: {self.dropped} early events were dropped (the "
                          f"record holds {self.capacity}); pass a larger capacity")

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
                                  for (d, h, l), row in self.totals().items()]}, f, indent=1)

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
        data["traceEvents"] = list(data.get("traceEvents", [])) + ours
        with open(path, "w") as f:
            json.dump(data, f)

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
        ax.set_xlabel("seconds from the start of the profile (host time of each decision)")
        ax.set_ylabel("MiB resident")
        ax.set_title("what torch_uvm kept on the GPU (budgets dashed)")
        ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def profile(capacity: int = 1 << 20) -> Profile:
    """Record what the residency policy does inside a ``with`` block: see
    the module's doc. `capacity`: the most events kept (the oldest go
    first, with a warning)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"torch_uvm.profile: capacity must be a positive int, got {capacity!r}")
    return Profile(capacity)
