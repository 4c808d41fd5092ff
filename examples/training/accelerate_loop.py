"""accelerate's ``Accelerator``: ``prepare``, ``accelerator.backward``,
``clip_grad_norm_``, ``optimizer.step`` and ``zero_grad``, in fp16 mixed
precision, with the model offloaded before the optimizer is made.

A 32 MiB classifier of 32 small layers trains within 8 MiB of the GPU.
``prepare`` wraps the streamed optimizer in an ``AcceleratedOptimizer``;
fp16 brings a ``GradScaler``: ``accelerator.backward`` scales the loss,
``clip_grad_norm_`` unscales the gradients and clips them by their global
norm, and a step whose gradients overflowed is skipped, in both runs alike.
Under autocast each layer's fp16 copy of its weight is made on the GPU when
the layer runs and kept by autograd for its backward: those copies (half
the weights' bytes at the end of the forward) are outside the budget.

    python examples/training/accelerate_loop.py
"""
import _common
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import torch_uvm

MiB = _common.MiB
WIDTH, DEPTH, CLASSES = 512, 32, 16    # 32 residual Linear(512, 512), a head: 32 MiB
# Training streams two layers' weights and one layer's gradients and two
# AdamW states (5 x 1 MiB); the rest of the budget stays resident.
BUDGET = 8 * MiB
STEPS = 16


class Residual(torch.nn.Sequential):
    def forward(self, x):
        return x + super().forward(x)


def classifier() -> torch.nn.Module:
    layers = [Residual(torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
              for _ in range(DEPTH)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, CLASSES))


def train(offload: bool) -> dict:
    _common.start()
    accelerator = Accelerator(mixed_precision="fp16")
    model = classifier()
    if offload:
        handle = torch_uvm.offload(model, budget=BUDGET)
        optimizer = handle.stream_optimizer(
            torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    else:
        handle = None
        model.cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    data = TensorDataset(torch.randn(STEPS * 64, WIDTH), torch.randint(CLASSES, (STEPS * 64,)))
    prepared, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(data, batch_size=64, shuffle=True))
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(prepared(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(prepared.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return _common.finish(losses, {"model": model}, [optimizer.optimizer], [handle], BUDGET)


if __name__ == "__main__":
    _common.main(train)
