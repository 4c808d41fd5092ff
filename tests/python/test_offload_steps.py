"""The streamed optimizer step's bookkeeping, without a GPU: what
offload_training asks the executor for (its C++ is tested on the GPU)."""
from types import SimpleNamespace

import pytest
import torch

from torch_uvm import offload_training


class Executor:
    """Records the room each step asks for its first states."""

    def __init__(self):
        self.rooms = []

    def bring(self, tensors, new_bytes):
        self.rooms.append(new_bytes)

    def step_done(self, tensors, written):
        pass


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1),                  # no state at all
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.AdamW(ps, lr=0.1),
], ids=["sgd", "sgd_momentum", "adamw"])
def test_room_for_first_states_is_asked_once_per_parameter(make):
    p = torch.nn.Parameter(torch.ones(1024))
    optimizer = make([p])
    handle = SimpleNamespace(executor=Executor(), host_step=0.0)
    unit = SimpleNamespace(trainable=[p], params=[p])

    def failing():
        raise RuntimeError("out of memory")

    p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError):   # a step that failed made nothing: asked again
        offload_training._step_unit(handle, optimizer, failing, unit, with_grads=True)
    for _ in range(3):
        p.grad = torch.ones_like(p)
        offload_training._step_unit(handle, optimizer, optimizer.step, unit, with_grads=True)
    first = offload_training.FIRST_STATES * p.nbytes
    assert handle.executor.rooms == [first, first, 0, 0]
