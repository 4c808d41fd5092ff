"""The streamed optimizer step's bookkeeping, without a GPU: what
offload_training asks the executor for (its C++ is tested on the GPU)."""
from types import SimpleNamespace

import pytest
import torch

from torch_uvm import offload_training


class Executor:
    """Records what each step brings and hands back."""

    def __init__(self):
        self.brought, self.done = [], []

    def bring(self, tensors):
        self.brought.append([id(t) for t in tensors])

    def step_done(self, tensors, written):
        self.done.append(([id(t) for t in tensors], [id(t) for t in written]))


def test_a_step_brings_weights_gradients_and_states_and_hands_back_what_it_made(monkeypatch):
    """The first step brings the weight and its gradient (no states yet) and
    hands back the states it made, as written; a later step brings them too.
    A step that failed half-way still hands back what it may have written."""
    # (states on the CPU here: taken as a GPU's would be)
    monkeypatch.setattr(offload_training, "state_tensors", lambda o, q: [
        t for t in o.state.get(q, {}).values() if isinstance(t, torch.Tensor) and t.dim()])
    p = torch.nn.Parameter(torch.ones(1024))
    optimizer = torch.optim.AdamW([p], lr=0.1)
    handle = SimpleNamespace(executor=Executor())
    unit = SimpleNamespace(trainable=[p])

    def failing():
        raise RuntimeError("out of memory")

    p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError):
        offload_training._step_unit(handle, optimizer, failing, unit, with_grads=True)
    assert handle.executor.brought == [[id(p), id(p.grad)]]
    assert handle.executor.done == [([id(p), id(p.grad)], [id(p)])]
    offload_training._step_unit(handle, optimizer, optimizer.step, unit, with_grads=True)
    states = [id(t) for t in offload_training.state_tensors(optimizer, p)]
    assert len(states) == 2                               # exp_avg, exp_avg_sq
    assert handle.executor.done[-1] == ([id(p), id(p.grad)] + states, [id(p)] + states)
    offload_training._step_unit(handle, optimizer, optimizer.step, unit, with_grads=True)
    assert handle.executor.brought[-1] == [id(p), id(p.grad)] + states
