"""A mixture-of-experts layer with top-1 routing by a learned router
(Switch-style): 16 experts of 8 MiB each, 136 MiB of weights in all, within
32 MiB of the GPU.

Each batch of 8 tokens goes to at most 8 of the 16 experts, and which ones
changes from batch to batch: an expert runs in one step and not in the next,
and the optimizer steps only the experts that had gradients (AdamW skips the
rest). Only the submodules that run stream.

    python examples/training/mixture_of_experts.py
"""
import _common
import torch
import torch.nn.functional as F

import torch_uvm

MiB = _common.MiB
WIDTH, EXPERTS, TOKENS, STEPS = 1024, 16, 8, 12
# The largest submodules are Linear(1024, 1024), 4 MiB: training streams two
# of them and one's gradients and two AdamW states (5 x 4 MiB).
BUDGET = 32 * MiB


class MoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(WIDTH, EXPERTS)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                                torch.nn.Linear(WIDTH, WIDTH)) for _ in range(EXPERTS))

    def forward(self, x):
        gate, choice = F.softmax(self.router(x), dim=-1).max(dim=-1)
        out = torch.zeros_like(x)
        for e in choice.unique().tolist():          # only the experts chosen
            rows = (choice == e).nonzero().squeeze(1)
            out[rows] = self.experts[e](x[rows]) * gate[rows, None]
        return x + out


def train(offload: bool) -> dict:
    _common.start()
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), MoE(), torch.nn.LayerNorm(WIDTH),
                                torch.nn.Linear(WIDTH, WIDTH))
    if offload:
        handle = torch_uvm.offload(model, budget=BUDGET)
        optimizer = handle.stream_optimizer(
            torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True))
    else:
        handle = None
        model.cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = torch.randn(STEPS, TOKENS, WIDTH).cuda(), torch.randn(STEPS, TOKENS, WIDTH).cuda()
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
