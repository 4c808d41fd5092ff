"""Evaluation before, between and after training steps, on an offloaded
model: ``model.eval()`` and ``torch.no_grad()`` (or
``torch.inference_mode()``), then ``model.train()`` again. 96 MiB of weights
within 32 MiB of the GPU.

The very first forward is an evaluation, before any training step: the
offload serves it, then trains, then evaluates again every three steps
(dropout off there, on in training) and once more at the end. The
evaluation losses are compared bit for bit with the all-resident run's like
the training losses.

    python examples/training/evaluation_anywhere.py
"""
import _common
import torch
import torch.nn.functional as F

import torch_uvm

MiB = _common.MiB
WIDTH, DEPTH, STEPS, EVAL_EVERY = 1024, 24, 10, 3  # 24 residual Linear(1024, 1024): 96 MiB
# Training streams two layers' weights and one layer's gradients and two
# AdamW states (5 x 4 MiB); the rest of the budget stays resident.
BUDGET = 32 * MiB


class Residual(torch.nn.Sequential):
    def forward(self, x):
        return x + super().forward(x)


def evaluate(model, x, y) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        loss = F.mse_loss(model(x), y)
    model.train()
    return loss


def train(offload: bool) -> dict:
    _common.start()
    model = torch.nn.Sequential(*[
        Residual(torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                 torch.nn.Dropout(0.1)) for _ in range(DEPTH)])
    if offload:
        handle = torch_uvm.offload(model, budget=BUDGET)
        optimizer = handle.stream_optimizer(
            torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    else:
        handle = None
        model.cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x, y = torch.randn(STEPS, 64, WIDTH).cuda(), torch.randn(STEPS, 64, WIDTH).cuda()
    held_out_x, held_out_y = torch.randn(64, WIDTH).cuda(), torch.randn(64, WIDTH).cuda()
    losses = [evaluate(model, held_out_x, held_out_y)]           # the first forward of all
    for step in range(STEPS):
        loss = F.mse_loss(model(x[step]), y[step])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
        if (step + 1) % EVAL_EVERY == 0:
            losses.append(evaluate(model, held_out_x, held_out_y))
    model.eval()
    with torch.inference_mode():
        losses.append(F.mse_loss(model(held_out_x), held_out_y))
    return _common.finish(losses, {"model": model}, [optimizer], [handle], BUDGET)


if __name__ == "__main__":
    _common.main(train)
