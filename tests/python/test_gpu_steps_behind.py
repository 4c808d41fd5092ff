"""A backward stepping on the GPU (``stream_optimizer(step_in_backward=True)``)
goes on with at most ``offload_state.STEPS_BEHIND`` units' steps under way
(core/steps_behind.h). A unit's gradients are let go once its step is
queued, but their memory is reused only once the step ran; without the
bound, steps that lag the backward (here each sleeps on its stream first)
keep every unit's gradients alive, and the process takes more GPU memory
than the estimate's gradients in flight. Read apart from the engine's books:
the allocator's active bytes (memory freed but waiting for a stream is still
active), with the bound and with it lifted."""
import pytest
import torch

import torch_uvm
from conftest import gpu
from offload_helpers import nothing_left_streamed  # noqa: F401 (autouse)
from torch_uvm import offload_state, offload_training

pytestmark = gpu

WIDTH, LAYERS, BATCH = 2048, 8, 512
GRADS = WIDTH * WIDTH * 4 + WIDTH * 4        # one Linear's gradients (16 MiB)


class SlowAdamW(torch.optim.AdamW):
    """AdamW whose every step first puts its stream to sleep (about 20 ms):
    the steps lag the backward, as a unit's states' copy makes them lag it
    when the backward's work on a unit is short."""

    def step(self, closure=None):
        torch.cuda._sleep(30_000_000)
        return super().step(closure)


def backward_growth(uvm):
    """The allocator's active bytes over a backward (its peak less where it
    began), in the second step (the states exist), and how often the
    backward waited for a step."""
    torch.manual_seed(0)
    blocks = []
    for _ in range(LAYERS):
        blocks += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # all resident (weights and states, 384 MiB): nothing waits for room, so
    # only the bound holds the host back
    handle = uvm.offload(model, budget=1 << 30)
    optimizer = handle.stream_optimizer(SlowAdamW(model.parameters(), lr=1e-4),
                                        step_in_backward=True)
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1)).cuda()
    for _ in range(2):
        loss = model(x).square().mean()
        torch.cuda.synchronize()
        start = torch.cuda.memory_stats()["active_bytes.all.current"]
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        growth = torch.cuda.memory_stats()["active_bytes.all.peak"] - start
    waits = handle.state.executor.waits_for_steps()
    handle.undo()
    return growth, waits


def test_a_backward_goes_on_with_at_most_steps_behind_steps_under_way(uvm, monkeypatch):
    bounded, waits = backward_growth(uvm)
    monkeypatch.setattr(offload_training, "STEPS_BEHIND", LAYERS * 4)
    lifted, lifted_waits = backward_growth(uvm)
    print(f"backward's growth: {bounded / 2**20:.0f} MiB bounded ({waits} waits), "
          f"{lifted / 2**20:.0f} MiB lifted ({lifted_waits} waits); a unit's gradients "
          f"{GRADS / 2**20:.0f} MiB")
    assert waits > 0 and lifted_waits == 0
    # the unit being made and STEPS_BEHIND stepping, and the activations'
    # gradients passing through (two of BATCH x WIDTH fp32 at a time)
    assert bounded <= (offload_state.STEPS_BEHIND + 1) * GRADS + 2 * BATCH * WIDTH * 4
    # lifted, the lagging steps hold more: the measurement sees what the bound does
    assert lifted >= bounded + 2 * GRADS
