"""An optimizer's own step over some of its parameters: its param groups
narrowed to them for the step, then put back. A streamed unit's step
(offload_training.py) and an FSDP2 param group's (fsdp.py) are each one."""
from __future__ import annotations

from typing import Callable, Set


def step_over(optimizer, own: Callable, ids: Set[int], kwargs) -> None:
    """`own(**kwargs)` (the optimizer's own step) over the parameters whose
    ids are in `ids` alone; the groups are as they were after, even if it
    raises."""
    groups = optimizer.param_groups
    saved = [g["params"] for g in groups]
    try:
        for g, all_params in zip(groups, saved):
            g["params"] = [p for p in all_params if id(p) in ids]
        own(**kwargs)
    finally:
        for g, all_params in zip(groups, saved):
            g["params"] = all_params
