"""memory_summary(): the statistics as a table like torch.cuda.memory_summary()."""
from typing import Dict


def _bytes(n: int) -> str:
    for unit in ("B ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:7.0f} {unit}" if unit == "B " else f"{n:7.2f} {unit}"
        n /= 1024
    return str(n)


_ROWS = [
    ("Allocated memory", "allocated_bytes", True),
    ("Active memory", "active_bytes", True),
    ("Requested memory", "requested_bytes", True),
    ("Reserved memory", "reserved_bytes", True),
    ("Non-releasable memory", "inactive_split_bytes", True),
    ("Allocations", "allocation", False),
    ("Active allocs", "active", False),
    ("Segments", "segment", False),
    ("Non-releasable allocs", "inactive_split", False),
]


def format_summary(stats: Dict[str, int]) -> str:
    width = 75
    line = "|" + "=" * (width - 2) + "|"
    out = [line,
           "|" + " torch_uvm managed memory summary".ljust(width - 2) + "|",
           "|" + f" cap: {_bytes(stats.get('cap_bytes', 0)).strip()}, "
                 f"OOMs: {stats.get('num_ooms', 0)}, retries: {stats.get('num_alloc_retries', 0)}"
                 .ljust(width - 2) + "|",
           line,
           "| Metric                 | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
           line]
    fmt = (lambda v: _bytes(v)) 
    for title, key, is_bytes in _ROWS:
        for pool, label in (("all", title), ("large_pool", "  from large pool"),
                            ("small_pool", "  from small pool")):
            vals = [stats.get(f"{key}.{pool}.{m}", 0) for m in ("current", "peak", "allocated", "freed")]
            cells = [fmt(v) if is_bytes else f"{v:10d}" for v in vals]
            out.append(f"| {label:<22} | " + " | ".join(f"{c:>10}" for c in cells) + " |")
        out.append("|" + "-" * (width - 2) + "|")
    out[-1] = line
    out += _residency_rows(stats, width, line)
    return "\n".join(out)


def _residency_rows(stats: Dict[str, int], width: int, line: str):
    """One block per GPU with a residency budget or streamed memory."""
    devices = sorted({k.split(".")[1] for k in stats if k.startswith("residency.")})
    rows = []
    for d in devices:
        def get(key):
            return stats.get(f"residency.{d}.{key}", 0)
        limit = get("limit")
        rows += [
            "|" + f" Residency on {d}: limit "
                  f"{_bytes(limit).strip() if limit else 'none'}".ljust(width - 2) + "|",
            "|" + f"   resident {_bytes(get('resident_bytes.current')).strip()}, peak "
                  f"{_bytes(get('resident_bytes.peak')).strip()}, brought "
                  f"{_bytes(get('prefetched_bytes')).strip()}".ljust(width - 2) + "|",
        ]
        for how in ("drop", "write_home", "discard"):
            rows.append("|" + f"   evictions by {how}: {get('evictions.' + how)} "
                              f"({_bytes(get('evicted_bytes.' + how)).strip()})"
                              .ljust(width - 2) + "|")
        rows.append(line)
    return rows
