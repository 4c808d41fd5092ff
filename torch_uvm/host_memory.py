"""The host memory this process can still take: what the kernel says it can
give without swapping (MemAvailable), and, in a container, what the
memory cgroup leaves under its limit, whichever is less. Pinned memory (an
offload's homes) is charged to the cgroup like any other: past its limit
the OOM killer ends the process, so the offload's check before pinning
(offload.py) and the activations' (activations.py) ask here.

A cgroup's room is its limit less its working set (its usage less the
inactive file pages the kernel reclaims first), as the kubelet counts it,
at its own level and at each level above it."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

# v1 writes "no limit" as a page-rounded 2**63 - 1.
_NO_LIMIT_V1 = 1 << 62


def host_room(proc: str = "/proc", cgroups: str = "/sys/fs/cgroup") -> Optional[Tuple[int, str]]:
    """(bytes, what says so) of the least room the host or this process's
    memory cgroup leaves, or None where neither says."""
    rooms = [r for r in (_mem_available(proc), _cgroup_room(proc, cgroups)) if r is not None]
    return min(rooms) if rooms else None


def host_available() -> Optional[int]:
    """The bytes of host_room(), or None."""
    room = host_room()
    return None if room is None else room[0]


def _mem_available(proc: str) -> Optional[Tuple[int, str]]:
    try:
        with open(os.path.join(proc, "meminfo")) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(proc: str, cgroups: str) -> Optional[Tuple[int, str]]:
    """The least room under a memory limit among this process's cgroup and
    those above it (v2, or v1's memory controller)."""
    try:
        with open(os.path.join(proc, "self", "cgroup")) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    rooms: List[Tuple[int, str]] = []
    for _, controllers, path in lines:
        if controllers == "":                                    # v2
            rooms += _rooms_up(cgroups, path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):                # v1
            rooms += _rooms_up(os.path.join(cgroups, "memory"), path, "memory.limit_in_bytes",
                               "memory.usage_in_bytes", "total_inactive_file")
    return min(rooms) if rooms else None


def _rooms_up(mount: str, path: str, limit_file: str, usage_file: str,
              inactive_key: str) -> List[Tuple[int, str]]:
    """The room under the limit at `path` and at each level above it, as
    far as the mount shows them (in a container, its own cgroup is the
    mount's root)."""
    rooms = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        folder = os.path.join(mount, *parts[:depth])
        limit = _read_int(os.path.join(folder, limit_file))
        usage = _read_int(os.path.join(folder, usage_file))
        if limit is None or usage is None or limit >= _NO_LIMIT_V1:
            continue
        inactive = _stat(os.path.join(folder, "memory.stat"), inactive_key)
        rel = "/" + "/".join(parts[:depth])
        rooms.append((max(limit - (usage - min(inactive, usage)), 0),
                      f"the memory cgroup {rel}'s {limit_file} ({limit} bytes)"))
    return rooms


def _read_int(file: str) -> Optional[int]:
    try:
        with open(file) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(file: str, key: str) -> int:
    try:
        with open(file) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0
