"""What an offload streams as one: its units. A unit is brought, run and let
go as a whole, with hooks on one module (its root) and the tensors of its
members (the modules whose own parameters and buffers it holds).

By default every submodule with tensors of its own is a unit: a Linear, a
norm, an embedding. `offload(..., units=...)` names the modules that stream
as one with everything below them instead, as FSDP2 users wrap a decoder
layer in fully_shard or accelerate keeps ``no_split_module_classes``
together: fewer, larger units, each brought ahead whole (LoRA's adapters
with their base weight, say, rather than three units of which two are
tiny)."""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch

from .residency import span_bytes


class Unit:
    """A module (the root) whose members' own parameters and buffers
    stream as one."""
    __slots__ = ("name", "module", "members", "targets", "buffers", "params", "trainable",
                 "index")

    def __init__(self, name: str, module: torch.nn.Module, targets: List[torch.Tensor]):
        self.name, self.module, self.targets = name, module, targets
        self.members: List[torch.nn.Module] = []        # whose own tensors it holds
        self.buffers: List[torch.Tensor] = []           # the targets that are buffers
        self.params: List[torch.nn.Parameter] = []      # whose gradients it streams, if any
        self.trainable: List[torch.nn.Parameter] = []   # those that require grad now
        self.index = -1                                  # in the executor and the lifecycle

    @property
    def nbytes(self) -> int:
        return sum(span_bytes(t) for t in {id(t): t for t in self.targets}.values())

    @property
    def trainable_bytes(self) -> int:
        return sum(span_bytes(p) for p in self.trainable)


def direct_tensors(module: torch.nn.Module):
    """(name, tensor, "param" or "buffer") of the module's own tensors."""
    for name, p in module._parameters.items():
        if p is not None:
            yield name, p, "param"
    for name, b in module._buffers.items():
        if b is not None:
            yield name, b, "buffer"


def offload_plan(module: torch.nn.Module) -> list:
    """(name, submodule, its own tensors as (name, tensor, kind), their
    bytes) for each submodule that has tensors of its own."""
    plan = []
    for name, m in module.named_modules():
        own = list(direct_tensors(m))
        if own:
            nbytes = sum(span_bytes(t) for _, t, _ in own)
            plan.append((name or type(m).__name__, m, own, nbytes))
    return plan


def unit_matcher(units) -> Callable[[torch.nn.Module], bool]:
    """offload's `units=` as a test of a module: module classes (one, or a
    list, tuple or set of them), class names (as Hugging Face models list
    theirs in ``_no_split_modules``), or a function of a module."""
    if isinstance(units, (type, str)):
        units = (units,)
    if isinstance(units, (list, tuple, set, frozenset)) and units and \
            all(isinstance(u, (type, str)) for u in units):
        classes = tuple(u for u in units if isinstance(u, type))
        names = {u for u in units if isinstance(u, str)}
        return lambda m: isinstance(m, classes) or type(m).__name__ in names
    if callable(units) and not isinstance(units, (list, tuple, set, frozenset)):
        return lambda m: bool(units(m))
    raise TypeError(f"torch_uvm: units= takes module classes, their names (as a model's "
                    f"_no_split_modules lists them) or a function of a module, got {units!r}")


def _runs(m: torch.nn.Module) -> bool:
    """Whether calling `m` runs a forward of its own (a ModuleList's or a
    ModuleDict's never runs: hooks on it would never fire)."""
    return type(m).forward is not torch.nn.Module.forward


def unit_roots(module: torch.nn.Module, units=None) -> Dict[int, Tuple[str, torch.nn.Module]]:
    """id(submodule) -> (name, root) of the unit its own tensors stream in:
    the outermost module above it (or itself) that `units` matches and that
    runs a forward of its own, else itself. A submodule in two places under
    different roots (or under one and none) streams on its own, as do those
    below it: the hooks of one root would not see its calls from the other.
    Refuses `units` that match no such submodule holding tensors, by name."""
    match = None if units is None else unit_matcher(units)
    roots: Dict[int, Tuple[str, torch.nn.Module]] = {}
    owners: Dict[int, set] = {}           # id(submodule) -> its roots' ids, in every place
    names: Dict[int, Tuple[str, torch.nn.Module]] = {}   # its first place's name, and it

    def walk(m: torch.nn.Module, name: str, root):
        if root is None and match is not None and _runs(m) and match(m):
            root = (name or type(m).__name__, m)
        names.setdefault(id(m), (name or type(m).__name__, m))
        roots.setdefault(id(m), root or names[id(m)])
        owners.setdefault(id(m), set()).add(None if root is None else id(root[1]))
        for child, sub in m.named_children():
            walk(sub, f"{name}.{child}" if name else child, root)
    walk(module, "", None)
    for i, places in owners.items():
        if len(places) > 1:
            roots[i] = names[i]
    if match is not None and not any(
            _runs(r) and match(r) for m in module.modules() for r in [roots[id(m)][1]]
            if any(True for _ in direct_tensors(m))):
        raise ValueError(f"torch_uvm: units={units!r} matches no submodule of "
                         f"{type(module).__name__} that holds parameters or buffers and runs "
                         f"a forward of its own (a ModuleList's never runs); its submodules' "
                         f"classes include "
                         f"{sorted({type(m).__name__ for m in module.modules()})[:8]}")
    return roots


def make_units(plan, roots, shared: Dict[int, torch.Tensor]) -> List[Unit]:
    """One unit per root, in the plan's order, its targets the replacements
    (`shared`) of its members' tensors, each once (a tied tensor is a
    target of every unit that holds it). Given the tensors themselves, the
    units as they will stream, to size them before anything changes."""
    units: Dict[int, Unit] = {}
    for _, m, own, _ in plan:
        name, root = roots[id(m)]
        u = units.get(id(root))
        if u is None:
            u = units[id(root)] = Unit(name, root, [])
        u.members.append(m)
        for _, t, kind in own:
            seen = shared[id(t)]
            if seen.numel() > 0 and all(x is not seen for x in u.targets):
                u.targets.append(seen)
                if kind == "buffer":    # a forward may write it, its version unmoved
                    u.buffers.append(seen)
    return list(units.values())
