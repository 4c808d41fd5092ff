"""One offload's state: what its forward hooks (offload.py), its backward
and streamed optimizer (offload_training.py) and its host's steps
(host_step.py) read and change. Each of those takes this object and reads
its public fields; none reaches into another's. The user's handle
(:class:`torch_uvm.offload.Offloaded`) holds it, as FSDP2's module holds
its FSDPState.

Also the least budget a module streams in (window_units, window_bytes):
the offload's checks and its plan read the same rule."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from . import _C
from .offload_units import Unit

# A backward stepping on the GPU goes on with at most this many units' steps
# under way (core/steps_behind.h): the gradients alive are theirs and the
# unit's being made (the estimate's gradients in flight).
STEPS_BEHIND = 1

# What training streams beside the resident prefix, in units of the largest
# submodule: `ahead + 1` submodules' weights, and one submodule's gradients
# and two optimizer states while it steps (needed); and the submodule's
# before it, whose weights and states are still on their way home (their
# memory counts until the copies pass: room for them lets the link's two
# directions overlap, where a step would otherwise wait for the last one's).
TRAINING_EXTRA = 3
TRAINING_HOMES = 3


def window_units(mode: str, training: bool, ahead: int, homes: bool = True) -> Tuple[int, int]:
    """What streaming needs beside the resident units: so many of the
    largest streamed submodule (the one running and those brought ahead),
    and so many of the largest submodule (a step's gradients and states,
    and, `homes`, the last step's copies home)."""
    if training:
        return ahead + 1, TRAINING_EXTRA + (TRAINING_HOMES if homes else 0)
    return (0 if mode == "in_place" else ahead + 1), 0


def window_bytes(mode: str, training: bool, ahead: int, largest: int,
                 largest_trainable: int = 0) -> int:
    """The least budget streaming needs beside the resident units: its
    window when the largest submodule streams, and a step of the largest
    trainable part (without room for copies home, which it then waits for)."""
    per_streamed, per_any = window_units(mode, training, ahead, homes=False)
    return per_streamed * largest + per_any * largest_trainable


class OffloadState:
    """One offload's settings, units, executor, optimizers and passes.
    `host_steps` is its host_step.HostSteps (made by the caller: this
    module stands below host_step.py). Each unit's state through a training
    pass (its backward, gradients and step) is `lifecycle`'s
    (csrc/core/unit_lifecycle.h), by the unit's index."""

    def __init__(self, module: torch.nn.Module, device: torch.device, budget: int, ahead: int,
                 mode: str, units: List[Unit], host_steps, replaced_ids: set):
        self.module, self.device, self.budget, self.ahead = module, device, budget, ahead
        self.mode = mode              # "auto" until the first forward decides
        self.asked = mode             # the mode offload() was given
        self.choose = False           # auto, small inputs: in place or prefetch after it
        self.units = units
        for k, u in enumerate(units):    # (the executor gives each the same index)
            u.index = k
        self.training = False         # planned for training (a forward built a graph)
        self.planned_step = 0         # the largest trainable bytes the plan made room for
        self.ranks: Optional[Dict[int, int]] = None   # forward_rank's, once planned
        self.executor = None          # made by the first forward, once the mode is known
        self.step_in_backward = False
        self.optimizers: List[tuple] = []   # (optimizer, its own step)
        self.host_step = 0.0                # the share of streamed units stepped on the host
        self.host_steps = host_steps
        self.lifecycle = _C.UnitLifecycle([u.name for u in units])
        self.step_stream = None             # step_in_backward's steps run on it (made when needed)
        self.param_ids: set = set()         # the streamed parameters' ids (install)
        self.gradient_hooks = None          # _C.GradientHooks, counting into lifecycle (install)
        self.hooks: list = []               # every hook it added (undo() removes them)
        self.replaced_ids = replaced_ids    # the ids of the module's tensors it replaced
        self.bound = None                   # gpu_memory.ProcessBound, given gpu_memory

    @property
    def learned(self) -> bool:
        return self.executor is not None and self.executor.planned()

    def streams(self, optimizer) -> bool:
        """Whether `optimizer` is one this offload streams."""
        return any(o is optimizer for o, _ in self.optimizers)

    def resident_units(self) -> List[Unit]:
        return [u for u in self.units if self.learned and self.executor.resident(u.index)]

    def units_in_order(self) -> List[Unit]:
        if not self.learned:
            return list(self.units)
        return [self.units[i] for i in self.executor.order()]

    def forward_rank(self, unit: Unit) -> int:
        if self.ranks is None:
            self.ranks = {u.index: k for k, u in enumerate(self.units_in_order())}
        return self.ranks.get(unit.index, len(self.units))

    def least_budget(self, training: bool = True) -> int:
        largest = max(u.nbytes for u in self.units)
        trainable = max(u.trainable_bytes for u in self.units)
        mode = "in_place" if self.mode == "in_place" else "prefetch"
        return window_bytes(mode, training, self.ahead, largest, trainable)

    def stepped_in_backward(self, params) -> List[str]:
        """The names of the submodules among `params`' whose gradients
        stepped in this backward (step_in_backward) and are gone until the
        next backward: what a clipping of them would not see."""
        if not self.step_in_backward:
            return []
        ids = {id(p) for p in params}
        return [self.units[i].name for i in self.lifecycle.stepped_in_backward()
                if any(id(p) in ids for p in self.units[i].params)]
