"""Progress on an offload's long waits: pinning its homes and reading a
checkpoint into them take seconds before the first token (7-12 s for a 7B
on an H100 host). Shown as Hugging Face's loaders show theirs, a tqdm bar on
stderr, once per offload, and only when it moves at least SHOW_FROM bytes.
``offload(progress=False)`` or TORCH_UVM_QUIET=1 hides it (parsed with the
other offload variables, csrc/core/config.cpp); ``progress=True`` shows it
whatever the size. Without tqdm, one line when it is done."""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional

from . import _C

SHOW_FROM = 1 << 30        # bytes: smaller offloads take well under a second


def check(progress) -> None:
    """Refuses a `progress` that is not None, True or False (offload's)."""
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"torch_uvm: offload's progress is True (always shown), False "
                         f"(never) or None (shown from {SHOW_FROM >> 30} GiB unless "
                         f"TORCH_UVM_QUIET=1); got {progress!r}")


def shown(progress: Optional[bool], total: int) -> bool:
    """Whether an offload moving `total` bytes shows its progress. Parses
    every offload variable, whatever `progress` and `total` are, so a bad
    one is refused at each offload, before anything changes."""
    quiet = _C.offload_environment()["quiet"]
    if progress is not None:
        return progress
    return total >= SHOW_FROM and not quiet


class Progress:
    """`total` bytes to go, counted by `update` from any thread (checkpoint
    reads complete on reader threads); `close` ends the display."""

    def __init__(self, total: int, what: str, show: bool, stream=None):
        self.total, self.what, self.done = total, what, 0
        self._lock = threading.Lock()
        self._stream = stream if stream is not None else sys.stderr
        self._start = time.perf_counter()
        self._bar = None
        self._show = show and total > 0
        if self._show:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=what, unit="B", unit_scale=True,
                             unit_divisor=1024, file=self._stream, leave=False)

    def update(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            if self._bar is not None:
                self._bar.update(nbytes)

    def close(self, failed: bool = False) -> None:
        """Ends the display: one line saying what was done, unless `failed`."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._show and not failed:
            seconds = time.perf_counter() - self._start
            print(f"{self.what}: {self.done / 2**30:.2f} GiB in {seconds:.1f} s",
                  file=self._stream, flush=True)
        self._show = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(failed=kind is not None)
