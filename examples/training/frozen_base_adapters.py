"""Adapters on a frozen base, written by hand: 16 blocks, each a frozen
``Linear(2048, 2048)`` (256 MiB in all) plus a rank-16 adapter, trained
within 64 MiB of the GPU, a quarter of the weights.

The base is frozen with ``requires_grad_(False)`` before the offload.
Frozen weights need no room for gradients or optimizer states: the budget
holds the window of two base layers (2 x 16 MiB) and an adapter's gradients
and states, and is less than training every weight would need (5 x 16 MiB).
The optimizer steps in backward (``step_in_backward=True``): each adapter
steps as soon as its gradients are complete.

    python examples/training/frozen_base_adapters.py
"""
import _common
import torch
import torch.nn.functional as F

import torch_uvm

MiB = _common.MiB
WIDTH, RANK, BLOCKS, STEPS = 2048, 16, 16, 10
BUDGET = 64 * MiB


class AdaptedLinear(torch.nn.Module):
    """A frozen linear layer plus a trainable low-rank update (zero at first), residual."""

    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(WIDTH, WIDTH)
        self.down = torch.nn.Linear(WIDTH, RANK, bias=False)
        self.up = torch.nn.Linear(RANK, WIDTH, bias=False)
        torch.nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return x + F.gelu(self.base(x) + self.up(self.down(x)))


def train(offload: bool) -> dict:
    _common.start()
    model = torch.nn.Sequential(*[AdaptedLinear() for _ in range(BLOCKS)])
    for block in model:
        block.base.requires_grad_(False)
    if offload:
        handle = torch_uvm.offload(model, budget=BUDGET)
    else:
        handle = None
        model.cuda()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                                  fused=True)
    if handle is not None:
        optimizer = handle.stream_optimizer(optimizer, step_in_backward=True)
    x, y = torch.randn(STEPS, 64, WIDTH).cuda(), torch.randn(STEPS, 64, WIDTH).cuda()
    losses = []
    for step in range(STEPS):
        loss = F.mse_loss(model(x[step]), y[step])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return _common.finish(losses, {"model": model}, [optimizer], [handle], BUDGET)


if __name__ == "__main__":
    _common.main(train)
