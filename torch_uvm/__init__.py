"""torch_uvm: unified (CUDA managed) memory for PyTorch.

With UVM on, new CPU and CUDA tensors come from one caching allocator over
``cudaMallocManaged``, and ``.to(device)`` of a managed tensor returns a tensor
of the new device on the same memory, prefetched there, instead of a copy.

    import torch_uvm
    torch_uvm.set_enabled_uvm(True)     # before the first CUDA tensor
    x = torch.randn(4096, 4096)         # managed, lives on the CPU
    y = x.to("cuda")                    # same memory, migrated to the GPU
    assert y.data_ptr() == x.data_ptr()

``PYTORCH_ENABLE_UNIFIED_MEMORY=1`` enables it at import. See docs/guide.md for
the pages by task and docs/api.md for the reference.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

import torch

from . import _C, _workers, sizes

__all__ = [
    "set_enabled_uvm", "get_enabled_uvm", "is_managed", "manage_memory", "unmanage_memory",
    "uvm_to", "prefetch", "advise", "set_move_on_copy", "get_move_on_copy",
    "set_move_advice", "get_move_advice", "set_fast_copy", "get_fast_copy",
    "memory_stats", "memory_summary", "memory_snapshot",
    "empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "set_memory_cap", "get_memory_cap", "set_release_threshold", "ADVICE",
    "set_residency_limit", "get_residency_limit", "residency_stats", "residency_shares",
    "offload", "offload_activations", "estimate", "prefetching", "evict",
    "bring", "profile", "expect_no_gpu_faults",
]

# Set in a child made by fork(): the GPUs and their books are the parent's.
_FORKED = False


def _forked() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_forked)

#: The advice names accepted by :func:`advise`.
ADVICE = ("read_mostly", "preferred_location", "accessed_by",
          "unset_read_mostly", "unset_preferred_location", "unset_accessed_by")

DeviceLike = Union[torch.device, str, int]


def _device(device: Optional[DeviceLike]) -> Optional[torch.device]:
    if device is None:
        return None
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def set_enabled_uvm(enabled: bool) -> None:
    """Turn unified memory on for new CPU and CUDA tensors.

    Must be called before PyTorch's CUDA allocator is initialized (before the
    first CUDA tensor or ``torch.cuda`` call that initializes CUDA). Enabling
    twice is a no-op. UVM cannot be turned off once on: ``False`` after
    ``True`` raises RuntimeError; ``False`` while off does nothing.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_enabled_uvm expects a bool, got {type(enabled).__name__}")
    if enabled:
        _C.enable()
        _prefer_safe_start_method()
    else:
        _C.disable()


def get_enabled_uvm() -> bool:
    """Whether unified memory is on."""
    return _C.is_enabled()


def is_managed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory comes from the managed allocator."""
    return _C.is_managed(tensor)


def manage_memory(tensor: torch.Tensor) -> torch.Tensor:
    """A managed copy of ``tensor``: same device, dtype, shape and strides."""
    return _C.manage_memory(tensor)


def unmanage_memory(tensor: torch.Tensor) -> torch.Tensor:
    """An ordinary (unmanaged) copy of ``tensor``."""
    return _C.unmanage_memory(tensor)


def uvm_to(tensor: torch.Tensor, device: DeviceLike, non_blocking: bool = False) -> torch.Tensor:
    """``tensor.to(device)``, zero-copy for a managed tensor even when
    :func:`set_move_on_copy` is off."""
    return _C.uvm_to(tensor, _device(device), non_blocking)


def prefetch(tensor: torch.Tensor, device: Optional[DeviceLike] = None,
             stream: Optional[torch.cuda.Stream] = None) -> None:
    """Migrate ``tensor``'s pages to ``device`` (default: its own device).

    The migration is ordered on ``stream`` (default: the current stream of the
    GPU involved), so kernels queued after it on that stream see resident data.
    Raises ValueError if ``tensor`` is not managed.
    """
    _C.prefetch(tensor, _device(device), stream)


def advise(tensor: torch.Tensor, advice: str, device: Optional[DeviceLike] = None) -> None:
    """Set a ``cudaMemAdvise`` hint on ``tensor``'s pages.

    ``advice`` is one of :data:`ADVICE`; ``device`` defaults to the tensor's.
    ``read_mostly`` lets every processor keep a read-only copy;
    ``preferred_location`` says where pages should live; ``accessed_by`` maps
    them for a GPU so it reads without faulting.
    """
    if not isinstance(advice, str):
        raise TypeError(f"advice must be a str, one of {ADVICE}")
    _C.advise(tensor, advice, _device(device))


def set_move_on_copy(enabled: bool) -> None:
    """Whether ``.to(device)`` of a managed tensor is zero-copy (default True).

    Off, moves copy as PyTorch does (into managed memory while UVM is on)."""
    _C.set_move_on_copy(bool(enabled))


def get_move_on_copy() -> bool:
    """Whether zero-copy moves are on."""
    return _C.move_on_copy()


def set_fast_copy(enabled: bool) -> None:
    """Whether copies between managed CPU tensors and GPUs take torch_uvm's
    fast paths (default True).

    Copies of 4 MiB or more: ``gpu.copy_(cpu)`` from a managed CPU tensor
    (``load_state_dict``, ``.to('cuda', dtype)``) prefetches the source's
    pages to that GPU and copies there: 44 GB/s for 1 GiB on an H100, against
    7.7 for PyTorch's copy. The source's pages stay on the GPU afterwards.
    ``cpu.copy_(gpu)`` into a managed CPU tensor goes through pinned buffers:
    38 GB/s against 14.5. Copies between tensors over the same memory, and,
    on a GPU with a residency budget, into CPU-homed memory (an offloaded
    weight), are PyTorch's. Off, every copy is PyTorch's."""
    _C.set_fast_copy(bool(enabled))


def get_fast_copy() -> bool:
    """Whether the fast copy paths are on."""
    return _C.fast_copy()


def set_move_advice(enabled: bool) -> None:
    """Also set the preferred location on every zero-copy move (default False:
    advice on populated memory costs ~16 ms per GiB; each segment's advice is
    set once at allocation instead)."""
    _C.set_move_advice(bool(enabled))


def get_move_advice() -> bool:
    """Whether moves also set the preferred location."""
    return _C.move_advice()


def memory_stats() -> Dict[str, int]:
    """Allocator statistics with the keys of ``torch.cuda.memory_stats()``,
    plus ``cap_bytes``. Counts cover the CPU and every GPU together.
    ``residency.cuda:N.*`` keys describe the memory streamed under GPU N's
    residency budget (see :func:`set_residency_limit`), and ``slots.cuda:N.*``
    the GPU memory that streamed tensors' slots hold there (allocated and
    reserved, now and at the peak: the budget's books, measured). An
    offload that streams draws its slots from one range of its budget's
    size (``arena_bytes``: all such ranges now); ``arena_misses`` counts
    slots that found no room there and were drawn beside it, and
    ``arena_waits`` the draws that waited for the GPU to pass a slot's
    last use. In a process made by fork() (a DataLoader worker), only the
    allocator's keys: the GPUs are the parent's, and another of its threads
    may have held their books' lock at the fork."""
    stats = dict(_C.memory_stats())
    if _FORKED:
        return dict(sorted(stats.items()))
    from .residency import residency_stats
    for d in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        residency = residency_stats(d)
        if residency["limit"] or residency["prefetched_bytes"]:
            stats.update({f"residency.cuda:{d}.{k}": v for k, v in residency.items()})
            if _C.is_enabled():  # PyTorch's own allocator then holds the slots alone
                stats.update({f"slots.cuda:{d}.{k}": v for k, v in _C.slot_memory_stats(d).items()})
    return dict(sorted(stats.items()))


def memory_snapshot() -> List[dict]:
    """Every segment and its blocks, like ``torch.cuda.memory_snapshot()``."""
    return _C.memory_snapshot()


def memory_summary() -> str:
    """A table of the statistics, in the style of ``torch.cuda.memory_summary()``."""
    from ._summary import format_summary
    return format_summary(memory_stats())


def empty_cache() -> None:
    """Return cached, unused managed memory to the driver (keeps the release
    threshold's worth), and the device memory cached for streamed tensors'
    slots."""
    _C.empty_cache()
    _C.release_cached_slots()
    from .residency import forget_advice
    forget_advice()


def reset_peak_memory_stats() -> None:
    """Reset every ``*.peak`` statistic to its current value (the residency
    budgets' and the slots' too)."""
    _C.reset_peak_memory_stats()
    for d in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        _C.residency_budget().reset_peak(d)
        if _C.is_enabled():
            _C.reset_slot_memory_peak(d)


def reset_accumulated_memory_stats() -> None:
    """Reset the ``*.allocated`` / ``*.freed`` counters and event counts."""
    _C.reset_accumulated_memory_stats()


def get_memory_cap() -> int:
    """The cap on managed bytes (reserved memory never exceeds it)."""
    return _C.memory_cap()


def set_memory_cap(cap: Union[int, float, str], allow_oversubscription: bool = False) -> None:
    """Set the cap on managed bytes: an int is bytes (or a size such as
    ``"40GiB"``, sizes.py), a float in (0, 1] a fraction of the free device
    memory seen at start.

    A cap above that free memory raises ValueError unless
    ``allow_oversubscription=True``: oversubscribed managed memory can stall
    the GPU for every process on it. A cap below the memory live tensors use
    raises ValueError.
    """
    if cap is None:
        raise TypeError("torch_uvm: the cap must be bytes (an int, or a size such as '20GiB') "
                        "or a fraction (a float in (0, 1]), got None")
    cap = sizes.bytes_or_fraction(cap, "cap", _C.safe_cap_limit)
    _C.set_memory_cap(cap, bool(allow_oversubscription))


def set_release_threshold(nbytes: Union[int, str]) -> None:
    """Bytes of free segments that :func:`empty_cache` keeps cached (an int,
    or a size such as ``"1GiB"``)."""
    nbytes = sizes.parse_bytes(nbytes, "the release threshold")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"the release threshold must be bytes (int), got {nbytes!r}")
    if nbytes < 0:
        raise ValueError(f"the release threshold must be >= 0, got {nbytes}")
    _C.set_release_threshold(int(nbytes))


def _install_tensor_methods() -> None:
    torch.Tensor.is_managed = lambda self: is_managed(self)
    torch.Tensor.manage_memory = lambda self: manage_memory(self)
    torch.Tensor.unmanage_memory = lambda self: unmanage_memory(self)
    torch.Tensor.uvm_to = lambda self, device, non_blocking=False: uvm_to(self, device, non_blocking)


def _prefer_safe_start_method() -> None:
    """See torch_uvm/_workers.py: forkserver unless the program chose a start
    method, and DataLoader workers that can read the dataset either way."""
    import multiprocessing
    import warnings
    _workers.prefer_safe_start_method()
    if multiprocessing.get_start_method(allow_none=True) == "fork":
        warnings.warn("torch_uvm: the multiprocessing start method is 'fork'. DataLoader "
                      "workers get copies of the dataset's managed tensors, but other "
                      "forked processes cannot read managed tensors of their parent: "
                      "start those with 'forkserver' or 'spawn'.", RuntimeWarning, stacklevel=3)


def _validate_environment() -> None:
    conf = os.environ.get("PYTORCH_UVM_ALLOC_CONF")
    if conf:
        _C.parse_alloc_conf(conf)


from .activations import offload_activations  # noqa: E402
from .estimate import estimate  # noqa: E402
from .offload import offload  # noqa: E402
from .profile import expect_no_gpu_faults, profile  # noqa: E402
from .residency import (bring, evict, get_residency_limit, prefetching,  # noqa: E402
                        residency_shares, residency_stats, set_residency_limit)

_install_tensor_methods()
_validate_environment()
_C.enable_from_environment()
if _C.is_enabled():
    _prefer_safe_start_method()
