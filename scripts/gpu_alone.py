"""Which GPU tests must have the GPU to themselves.

A test that reads the device's memory (free bytes, or where the driver put
a tensor) or sizes its work by the managed-memory cap (set from the free
memory when the allocator starts) sees another process's allocations as
its own. Such a test runs with no other test on the GPU, in the mutant
runs (scripts/mutants.py) and in the GPU suite run side by side
(scripts/gpu_pytest.py). The rule is read from the source, so a new test
that measures the device is found without a mark: its function mentions
one of MARKERS, or names (directly or through others) a function or
fixture of its module, or of the helpers beside it, that does.
"""
import ast
import os
import re

MARKERS = ("mem_get_info", "gpu_bytes", "get_memory_cap", "set_memory_cap", "safe_cap_limit")


def _functions(path, cache):
    """{name: source} of every function in the file (same names joined)."""
    if path not in cache:
        found = {}
        try:
            with open(path) as f:
                source = f.read()
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[node.name] = (found.get(node.name, "") + "\n"
                                        + (ast.get_source_segment(source, node) or ""))
        except (OSError, SyntaxError, ValueError):
            pass
        cache[path] = found
    return cache[path]


def measures_device_memory(test, root, cache=None):
    """Whether the pytest `test` ("path::name[id]", path relative to `root`)
    must have the GPU alone (the module's docstring says when)."""
    cache = {} if cache is None else cache
    path, _, name = test.partition("::")
    name = name.split("::")[-1].split("[")[0]
    folder = os.path.dirname(os.path.join(root, path))
    try:
        helpers = sorted(f for f in os.listdir(folder)
                         if f.endswith(".py") and not f.startswith("test_"))
    except OSError:
        return False
    functions = {}
    for f in helpers + [os.path.basename(path)]:
        functions.update(_functions(os.path.join(folder, f), cache))
    measuring = {n for n, src in functions.items() if any(m in src for m in MARKERS)}
    while True:
        names = re.compile(r"\b(?:%s)\b" % "|".join(map(re.escape, measuring))) if measuring else None
        more = {n for n, src in functions.items()
                if n not in measuring and names and names.search(src)}
        if not more:
            return name in measuring
        measuring |= more
