"""Lightning ``Trainer.fit`` with automatic optimization, training a model
whose weights, gradients and AdamW states (384 MiB) are 12 times its
budget (32 MiB of the GPU).

torch_uvm's strategy, ``OffloadStrategy(budget=..., submodule="net")``,
offloads the module's net where Lightning would move it to the GPU, and
streams the optimizer ``configure_optimizers`` returns, written as for any
Trainer. Lightning calls ``optimizer.step(closure)``: the closure runs
``training_step`` and backward, then the step streams. The sanity check
and each epoch's validation evaluate the same streamed weights. A
checkpoint is saved after two epochs, and a new Trainer resumes from it
(``ckpt_path=``) with a new module, as a new process would.

With ``--precision 16-mixed``, Lightning's mixed-precision plugin runs the
forward under fp16 autocast and steps through its ``GradScaler``: the fused
AdamW unscales inside its own step (``grad_scale``, ``found_inf``), one
streamed submodule at a time.

    python examples/training/lightning_trainer.py [--precision 16-mixed]
"""
import argparse
import os
import tempfile
import warnings

import _common
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from torch_uvm.lightning import OffloadStrategy

MiB = _common.MiB
WIDTH, DEPTH = 1024, 24          # 24 residual Linear(1024, 1024): 96 MiB of fp32 weights
# Training streams two layers' weights and one layer's gradients and two
# AdamW states (5 x 4 MiB); the rest of the budget stays resident.
BUDGET = 32 * MiB

warnings.filterwarnings("ignore", ".*does not have many workers.*")


class Residual(torch.nn.Sequential):
    def forward(self, x):
        return x + super().forward(x)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(*[
            Residual(torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
            for _ in range(DEPTH)])
        self.optimizer = None
        self.losses = []

    def configure_optimizers(self):
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=1e-3, fused=True)
        return self.optimizer

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.detach())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.losses.append(F.mse_loss(self.net(x), y))


def trainer(root: str, max_epochs: int, precision: str, offload: bool) -> L.Trainer:
    strategy = OffloadStrategy(budget=BUDGET, submodule="net") if offload else "auto"
    return L.Trainer(accelerator="gpu", devices=1, max_epochs=max_epochs, default_root_dir=root,
                     precision=precision, strategy=strategy,
                     num_sanity_val_steps=2, check_val_every_n_epoch=1, deterministic=True,
                     logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False)


def train(offload: bool, precision: str = "32-true") -> dict:
    _common.start()
    L.seed_everything(_common.SEED, verbose=False)
    data = TensorDataset(torch.randn(512, WIDTH), torch.randn(512, WIDTH))
    val = TensorDataset(torch.randn(128, WIDTH), torch.randn(128, WIDTH))
    train_loader = DataLoader(data, batch_size=64, shuffle=True)
    val_loader = DataLoader(val, batch_size=64)
    peaks = []
    with tempfile.TemporaryDirectory() as root:
        first, fit = Regressor(), trainer(root, 2, precision, offload)
        fit.fit(first, train_loader, val_loader)
        path = os.path.join(root, "epoch2.ckpt")
        fit.save_checkpoint(path)
        handle = getattr(fit.strategy, "handle", None)   # (Lightning's teardown undid it)
        if handle is not None:
            peaks.append(_common.undo(handle))
        # a new module and a new Trainer go on from the checkpoint
        resumed, again = Regressor(), trainer(root, 3, precision, offload)
        again.fit(resumed, train_loader, val_loader, ckpt_path=path)
    return _common.finish(first.losses + resumed.losses, {"net": resumed.net}, [resumed.optimizer],
                          [getattr(again.strategy, "handle", None)], BUDGET, peaks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="32-true", help="Lightning's: 32-true, 16-mixed")
    precision = parser.parse_args().precision
    _common.main(lambda offload: train(offload, precision))
