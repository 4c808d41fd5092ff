"""Worker processes with UVM on: which start method, and what a forked
DataLoader worker reads.

fork() does not carry managed memory into the child, and with UVM on every
new CPU tensor is managed, so a dataset built in the parent cannot be read by
a forked worker. Two ways out, and torch_uvm uses both:

* Unless the program chose a start method, new processes start with
  'forkserver', which hands tensors to workers through shared memory.
  forkserver re-runs the main script in each worker, so a script that starts
  DataLoader workers outside ``if __name__ == "__main__":`` would start them
  again there. Such a DataLoader's workers fork instead (with a warning).
* Before a DataLoader's workers fork, the managed CPU tensors reachable from
  its dataset and collate function are copied into ordinary memory, which the
  workers inherit; each worker reads its copy, as fork() would give it the
  parent's memory at that moment. The parent's tensors are left as they were.
"""
from __future__ import annotations

import ast
import functools
import multiprocessing
import os
import sys
import types
import warnings
from typing import Dict, List, Optional, Tuple

import torch

from . import _C

_CHOSEN_BY_TORCH_UVM: Optional[str] = None   # the start method torch_uvm set
_GUARDED_LINES: Dict[str, List[Tuple[int, int]]] = {}
_PENDING_COPIES: List[Tuple[torch.Tensor, torch.Tensor]] = []  # read in forked children
_MAX_OBJECTS = 100_000


def prefer_safe_start_method() -> None:
    """Make 'forkserver' the start method unless the program chose one."""
    global _CHOSEN_BY_TORCH_UVM
    method = multiprocessing.get_start_method(allow_none=True)
    if method is None and "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("forkserver")
        _CHOSEN_BY_TORCH_UVM = "forkserver"
    _install_dataloader_hook()


# --- is the running code under `if __name__ == "__main__":`? ---------------

def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    names = [n for n in ast.walk(node.test)]
    return (any(isinstance(n, ast.Name) and n.id == "__name__" for n in names)
            and any(isinstance(n, ast.Constant) and n.value == "__main__" for n in names))


def _guarded_lines(path: str) -> List[Tuple[int, int]]:
    if path not in _GUARDED_LINES:
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            _GUARDED_LINES[path] = [(n.lineno, n.end_lineno or n.lineno)
                                    for n in tree.body if _is_main_guard(n)]
        except (OSError, SyntaxError, ValueError):
            _GUARDED_LINES[path] = []
    return _GUARDED_LINES[path]


def runs_outside_main_guard() -> bool:
    """True when the main script's top-level code, outside an
    ``if __name__ == "__main__":`` block, led to this call: a start method
    that re-runs the script in the child would run that code again there."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or multiprocessing.parent_process() is not None:
        return False           # `python -c`, a REPL, or a worker: nothing re-runs
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            line = frame.f_lineno
            return not any(first <= line <= last for first, last in _guarded_lines(path))
        frame = frame.f_back
    return False               # the script's top level has finished (e.g. a callback)


# --- what forked workers read -------------------------------------------------

def _is_library(obj) -> bool:
    module = (getattr(obj, "__module__", None) or "").split(".")[0]
    return module in sys.stdlib_module_names or module in ("builtins", "torch", "numpy")


def _named_by(function: types.FunctionType) -> list:
    """What a function can read besides its arguments: its closure, and the
    globals its code (or code nested in it) names."""
    found = []
    for cell in function.__closure__ or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:    # an empty cell
            pass
    codes, names = [function.__code__], set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    found.extend(function.__globals__[n] for n in names if n in function.__globals__)
    found.extend(d for d in function.__defaults__ or ())
    return found


def _managed_cpu_tensors(roots) -> List[torch.Tensor]:
    """Managed CPU tensors reachable from `roots` through attributes,
    containers and slots, one per storage."""
    found: Dict[int, torch.Tensor] = {}
    seen = set()
    stack = list(roots)
    while stack and len(seen) < _MAX_OBJECTS:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu" and not obj.is_meta and _C.is_managed(obj):
                found.setdefault(obj.untyped_storage().data_ptr(), obj)
            continue
        if isinstance(obj, types.ModuleType):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, functools.partial):
            stack.extend((obj.func, *obj.args, *obj.keywords.values()))
        elif isinstance(obj, types.MethodType):
            stack.extend((obj.__self__, obj.__func__))
        elif isinstance(obj, types.FunctionType):
            if not _is_library(obj):
                stack.extend(_named_by(obj))
            continue
        elif isinstance(obj, type):               # methods and class attributes
            if not _is_library(obj):
                stack.extend(vars(obj).values())
                stack.extend(b for b in obj.__bases__ if b is not object)
            continue
        if hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
        stack.append(type(obj))
        for slot in getattr(type(obj), "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                stack.append(getattr(obj, slot))
    return list(found.values())


def _copies_for_forked_workers(loader) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    copies = []
    for tensor in _managed_cpu_tensors([loader.dataset, loader.collate_fn]):
        whole = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
        copies.append((tensor, _C.unmanage_memory(whole)))
    return copies


def _adopt_copies_in_child() -> None:
    for tensor, copy in _PENDING_COPIES:
        _C.adopt_copy_in_forked_child(tensor, copy)
    _PENDING_COPIES.clear()


def _start_method(loader) -> str:
    context = loader.multiprocessing_context
    return (context.get_start_method() if context is not None
            else multiprocessing.get_start_method())


def _workers_starting(iterator_init):
    @functools.wraps(iterator_init)
    def init(self, loader, *args, **kwargs):
        if not _C.is_enabled() or loader.num_workers == 0:
            return iterator_init(self, loader, *args, **kwargs)
        chosen = loader.multiprocessing_context
        switch = (chosen is None and _CHOSEN_BY_TORCH_UVM is not None
                  and multiprocessing.get_start_method() == _CHOSEN_BY_TORCH_UVM
                  and runs_outside_main_guard())
        if switch:
            warnings.warn(
                "torch_uvm: this script starts DataLoader workers outside an "
                "`if __name__ == \"__main__\":` block. The start method torch_uvm chose "
                f"('{_CHOSEN_BY_TORCH_UVM}') would run the whole script again in every "
                "worker, so these workers fork instead, each with a copy of the dataset's "
                "managed tensors. To use forkserver, put the script's code under "
                "`if __name__ == \"__main__\":`; or choose a start method yourself "
                "(DataLoader(multiprocessing_context=...) or "
                "multiprocessing.set_start_method before importing torch_uvm).",
                RuntimeWarning, stacklevel=4)
            loader.multiprocessing_context = "fork"
        try:
            if _start_method(loader) != "fork":
                return iterator_init(self, loader, *args, **kwargs)
            self._torch_uvm_forked = True
            _PENDING_COPIES[:] = _copies_for_forked_workers(loader)
            try:
                return iterator_init(self, loader, *args, **kwargs)
            finally:
                _PENDING_COPIES.clear()   # the workers have forked; they hold their copies
        finally:
            if switch:
                loader.multiprocessing_context = chosen
    init._torch_uvm_hook = True
    return init


def _explaining_worker_crashes(next_data):
    @functools.wraps(next_data)
    def wrapped(self):
        try:
            return next_data(self)
        except RuntimeError as e:
            text = str(e)
            if not getattr(self, "_torch_uvm_forked", False) or not (
                    "Segmentation fault" in text or "Bus error" in text
                    or "exited unexpectedly" in text):
                raise
            raise RuntimeError(
                "torch_uvm: a DataLoader worker made by fork() died. Most likely it read a "
                "managed tensor of the parent process that torch_uvm did not find: fork() "
                "does not carry managed memory into the child, so torch_uvm copies the "
                "managed tensors reachable from the dataset and the collate_fn (through "
                "attributes, containers, closures, and the globals their functions name), "
                "and no others. Fix it with DataLoader(multiprocessing_context='forkserver') "
                "(or 'spawn'), with the script's code under `if __name__ == \"__main__\":`; "
                "or keep that tensor where the dataset reaches it; or make it an ordinary "
                "tensor (torch_uvm.unmanage_memory).") from e
    wrapped._torch_uvm_hook = True
    return wrapped


def _install_dataloader_hook() -> None:
    from torch.utils.data import dataloader
    cls = dataloader._MultiProcessingDataLoaderIter
    if not getattr(cls.__init__, "_torch_uvm_hook", False):
        cls.__init__ = _workers_starting(cls.__init__)
        cls._next_data = _explaining_worker_crashes(cls._next_data)
        os.register_at_fork(after_in_child=_adopt_copies_in_child)
