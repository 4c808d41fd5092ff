"""An optimizer's own step over some of its parameters: its param groups
narrowed to them for the step, then put back. A streamed unit's step
(offload_training.py) and an FSDP2 param group's (fsdp.py) are each one.

``on_local_shards=True`` steps DTensors (FSDP2's shards) through plain
tensors that share their storage: the parameter's local shard, its
gradient's and its states'. For an elementwise optimizer this is the same
arithmetic on the same memory. It matters on a thread beside the backward:
DTensor's dispatch runs in Python and keeps the GIL through the whole
kernel, so a host worker stepping DTensors stalls every Python hook of the
backward (FSDP2's among them) for as long as each step runs. The
optimizer's step hooks see the plain tensors in its param groups."""
from __future__ import annotations

from typing import Callable, List, Set, Tuple

import torch


def _is_dtensor(t) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def _locals(optimizer, params) -> List[Tuple[torch.Tensor, torch.Tensor, dict]]:
    """(plain tensor, DTensor parameter, its local states) for each of `params`:
    the plain tensor shares the shard's storage and holds its gradient's local
    shard; empty if any lacks a state (the optimizer's first step makes its
    states, as DTensors, from the parameters it sees)."""
    out = []
    for p in params:
        state = optimizer.state.get(p)
        if not _is_dtensor(p) or not state:
            return []
        with torch.no_grad():
            plain = p.to_local().detach()
            if p.grad is not None:
                plain.grad = p.grad.to_local().detach()
            out.append((plain, p, {k: v.to_local() if _is_dtensor(v) else v
                                   for k, v in state.items()}))
    return out


def step_over(optimizer, own: Callable, ids: Set[int], kwargs,
              on_local_shards: bool = False) -> None:
    """`own(**kwargs)` (the optimizer's own step) over the parameters whose
    ids are in `ids` alone; the groups are as they were after, even if it
    raises. With `on_local_shards`, DTensors step through their local shards
    (the module's doc), once each has a state."""
    groups = optimizer.param_groups
    saved = [g["params"] for g in groups]
    swapped = []
    try:
        for g, all_params in zip(groups, saved):
            chosen = [p for p in all_params if id(p) in ids]
            local = _locals(optimizer, chosen) if on_local_shards else []
            if local:
                for plain, _, states in local:
                    optimizer.state[plain] = dict(states)     # (the step may replace some)
                swapped += local
                chosen = [plain for plain, _, _ in local]
            g["params"] = chosen
        own(**kwargs)
    finally:
        for g, all_params in zip(groups, saved):
            g["params"] = all_params
        # every plain key out of the optimizer's state first (its state_dict
        # knows only its parameters), then what the step replaced written back
        afters = [(p, states, optimizer.state.pop(plain, {})) for plain, p, states in swapped]
        with torch.no_grad():
            for p, states, after in afters:
                for k, v in after.items():    # (one the step replaced, not updated in place)
                    if v is not states.get(k):
                        kept = optimizer.state[p].get(k)
                        if _is_dtensor(kept):
                            kept.to_local().copy_(v)
                        else:
                            optimizer.state[p][k] = v
