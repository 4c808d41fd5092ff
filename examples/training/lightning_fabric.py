"""Lightning Fabric: ``fabric.setup(model, optimizer)``,
``fabric.backward(loss)``, ``optimizer.step()``, written as for any Fabric;
torch_uvm's ``OffloadFabricStrategy`` offloads the model in ``setup`` and
streams the optimizer.

A residual MLP of 96 MiB trains within 32 MiB of the GPU. The optimizer
steps in backward (``step_in_backward=True``): each submodule steps as soon
as its gradients are complete, while its weights are still on the GPU, and
its gradients never cross the link; ``optimizer.step()`` finishes the rest.
(No clipping by global norm, and no accumulation, that way.)

    python examples/training/lightning_fabric.py
"""
import _common
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from torch_uvm.fabric import OffloadFabricStrategy

MiB = _common.MiB
WIDTH, DEPTH = 1024, 24          # 24 blocks of LayerNorm + Linear(1024, 1024): 96 MiB
# Training streams two blocks' weights and one block's gradients and two
# AdamW states (5 x 4 MiB); the rest of the budget stays resident.
BUDGET = 32 * MiB
STEPS = 12


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + F.gelu(self.linear(self.norm(x)))


def train(offload: bool) -> dict:
    _common.start()
    # torch_uvm's strategy offloads the model where Fabric would move it to the GPU,
    # and streams the optimizer fabric.setup is given
    strategy = OffloadFabricStrategy(budget=BUDGET, step_in_backward=True) if offload else "auto"
    fabric = L.Fabric(accelerator="cuda", devices=1, precision="32-true", strategy=strategy)
    fabric.seed_everything(_common.SEED, verbose=False)
    model = torch.nn.Sequential(*[Block() for _ in range(DEPTH)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = TensorDataset(torch.randn(STEPS * 32, WIDTH), torch.randn(STEPS * 32, WIDTH))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=32, shuffle=True))
    fabric_model, fabric_optimizer = fabric.setup(model, optimizer)
    losses = []
    for x, y in loader:
        loss = F.mse_loss(fabric_model(x), y)
        fabric.backward(loss)
        fabric_optimizer.step()
        fabric_optimizer.zero_grad()
        losses.append(loss.detach())
    handle = strategy.handle if offload else None
    return _common.finish(losses, {"model": model}, [optimizer], [handle], BUDGET)


if __name__ == "__main__":
    _common.main(train)
