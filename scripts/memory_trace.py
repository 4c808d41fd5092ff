"""A pytest plugin for finding what a GPU test leaves behind: after each
test, one line of the process's GPU memory as the driver measures it
(mem_get_info), torch_uvm's managed books (reserved, allocated, the bytes
reserved outside them, the largest cached free block) and PyTorch's own
allocator's reserved bytes, before and after emptying the caches.

    python3 -m pytest -p scripts.memory_trace tests/python/...   (or -p memory_trace
                                                             with scripts/ on the path)
Lines start with "memory-trace"; they go to the file MEMORY_TRACE names, or
to stderr (pytest -s shows them).
"""
import gc
import os
import sys


def _line(item_id: str) -> str:
    import torch
    if not torch.cuda.is_available():
        return ""
    import torch_uvm
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    used_before = total - free
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    s = torch_uvm.memory_stats() if torch_uvm.get_enabled_uvm() else {}
    mib = lambda b: f"{b / 2**20:.0f}"  # noqa: E731
    fields = [f"used {mib(used_before)}->{mib(total - free)} MiB",
              f"native_reserved {mib(torch.cuda.memory_reserved())}"]
    for key, value in sorted(s.items()):    # (the books' current bytes, and the cap)
        if value and (key.endswith("bytes.all.current") or key.startswith("slots.")
                      and key.endswith("bytes.current") or key in ("cap_bytes", "segment.all.current")):
            fields.append(f"{key.replace('.current', '')} {mib(value) if 'bytes' in key else value}")
    return f"memory-trace {item_id}: " + ", ".join(f for f in fields if f)


def pytest_runtest_teardown(item, nextitem):
    try:
        line = _line(item.nodeid)
    except Exception as e:  # a trace never fails a test
        line = f"memory-trace {item.nodeid}: unreadable ({e})"
    if line:
        path = os.environ.get("MEMORY_TRACE")
        if path:
            with open(path, "a") as f:
                print(line, file=f)
        else:
            print(line, file=sys.stderr, flush=True)
