"""Progressive unfreezing: training starts with only the last two of eight
blocks trainable, and every two steps one more block, from the top down,
is unfrozen with ``requires_grad_(True)``. 96 MiB of weights within 32 MiB
of the GPU.

The optimizer is made once, over every parameter, up front: AdamW skips
parameters without gradients, and gives a block its states at its first
step. Between steps ``requires_grad`` may change: a frozen block takes no
room for gradients or states, an unfrozen one streams them from its next
step on. The budget holds the window for training every block (two layers'
weights and one layer's gradients and two states, 5 x 4 MiB), which the
last steps do.

    python examples/training/progressive_unfreezing.py
"""
import _common
import torch
import torch.nn.functional as F

import torch_uvm

MiB = _common.MiB
WIDTH, BLOCKS, LAYERS = 1024, 8, 3   # 8 residual blocks of 3 Linear(1024, 1024): 96 MiB
BUDGET = 32 * MiB
TRAINABLE_AT_FIRST, EVERY = 2, 2
STEPS = (BLOCKS - TRAINABLE_AT_FIRST + 1) * EVERY


class Residual(torch.nn.Sequential):
    def forward(self, x):
        return x + super().forward(x)


def block() -> torch.nn.Module:
    layers = [m for _ in range(LAYERS) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())]
    return Residual(torch.nn.LayerNorm(WIDTH), *layers)


def train(offload: bool) -> dict:
    _common.start()
    model = torch.nn.Sequential(*[block() for _ in range(BLOCKS)])
    for b in model[:BLOCKS - TRAINABLE_AT_FIRST]:
        b.requires_grad_(False)
    if offload:
        handle = torch_uvm.offload(model, budget=BUDGET)
        optimizer = handle.stream_optimizer(
            torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    else:
        handle = None
        model.cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x, y = torch.randn(STEPS, 64, WIDTH).cuda(), torch.randn(STEPS, 64, WIDTH).cuda()
    losses = []
    for step in range(STEPS):
        if step and step % EVERY == 0:
            model[BLOCKS - TRAINABLE_AT_FIRST - step // EVERY].requires_grad_(True)
        loss = F.mse_loss(model(x[step]), y[step])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return _common.finish(losses, {"model": model}, [optimizer], [handle], BUDGET)


if __name__ == "__main__":
    _common.main(train)
