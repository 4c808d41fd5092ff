"""Lightning's ``Trainer`` streaming a model larger than the GPU, by its
strategy, with ``configure_model`` and ``configure_optimizers`` as users
write them:

    from torch_uvm.lightning import OffloadStrategy
    trainer = L.Trainer(accelerator="gpu", devices=1,
                        strategy=OffloadStrategy(budget="8GiB", step_in_backward=True))
    trainer.fit(module, loader)

Where Lightning's single-device strategy moves the module to its GPU, this
one offloads it (the whole LightningModule, or its submodule `submodule`,
the rest then moved as usual), and it streams every optimizer that
``configure_optimizers`` returns, its schedulers included. Optimizer states
stay in their homes: they are not moved to the GPU at setup, nor to the
CPU at teardown. Lightning's teardown moves the module to the CPU, which
undoes the offload and gives the states back on the CPU in place; the next
``fit`` (or ``validate``, ``test``, ``predict``, each pinning the homes
anew) offloads it again. One strategy per Trainer, as Lightning's own.

Data parallel over several GPUs, each rank streaming its own replica
(docs/training.md): ``OffloadDDPStrategy``, Lightning's DDP strategy with
each rank's module offloaded on its GPU before DDP wraps it:

    trainer = L.Trainer(accelerator="gpu", devices=2,
                        strategy=OffloadDDPStrategy(budget="8GiB"))

Imports lightning: only for those who use it."""
from __future__ import annotations

from typing import Optional

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.trainer.states import TrainerFn

from .strategy_settings import Settings, StrategySettings
from .offload import offload


class Offloading:
    """What both of torch_uvm's Lightning strategies do: offload the module
    where Lightning would move it, and stream every optimizer that
    ``configure_optimizers`` returns (a Settings' `handle`, `stream`)."""

    def model_to_device(self) -> None:
        module = self.lightning_module
        target = module.get_submodule(self.submodule) if self.submodule else module
        # Still offloaded from an earlier fit (Lightning 2.x's teardown undoes it): undone
        # first, so that no optimizer of that fit stays streamed beside the new ones
        if self.handle is not None and self.handle.offloaded:
            self.handle.undo()
        self.handle = offload(target, budget=self.budget, device=self.root_device,
                              **self.offload_options)
        # the rest, and module.device; the offloaded part stays (a move that changes nothing)
        module.to(self.root_device)

    def setup_optimizers(self, trainer: "pl.Trainer") -> None:
        super().setup_optimizers(trainer)
        for optimizer in self.optimizers:      # (the handle is new: model_to_device made it)
            self.handle.stream_optimizer(optimizer, **self.stream)

    def teardown(self) -> None:
        """Lightning's, but for the move of the optimizers' states to the
        CPU: a streamed optimizer's states are in their homes, which the
        module's move to the CPU (the offload's undo) gives back in place; a
        move of them first would copy every state."""
        optimizers, self.optimizers = self.optimizers, []
        try:
            super().teardown()
        finally:
            self.optimizers = optimizers


class OffloadStrategy(Offloading, StrategySettings, SingleDeviceStrategy):
    """Settings as StrategySettings takes them (budget, device, submodule,
    step_in_backward, host_step, non_blocking, offload's others); the
    device defaults to the Trainer's one (``devices=[1]`` is cuda:1)."""

    strategy_name = "torch_uvm_offload"
    SEVERAL = "Trainer(strategy=torch_uvm.lightning.OffloadDDPStrategy(...)) streams each " \
              "rank's replica"

    def check(self, trainer: "pl.Trainer") -> None:
        """Refuses, before anything is offloaded, what a step in backward
        cannot keep: clipping, accumulation, a loss scaler."""
        if not self.stream["step_in_backward"] or trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.gradient_clip_val:
            raise ValueError(
                f"torch_uvm: OffloadStrategy(step_in_backward=True) with Trainer(gradient_clip_val="
                f"{trainer.gradient_clip_val}): each submodule steps in backward, so no gradient "
                f"is left to clip. Drop gradient_clip_val, or step_in_backward")
        scheduled = [c for c in trainer.callbacks   # (GradientAccumulationScheduler's, later)
                     if getattr(c, "going_to_accumulate_grad_batches", lambda: False)()]
        if trainer.accumulate_grad_batches > 1 or scheduled:
            raise ValueError(
                f"torch_uvm: OffloadStrategy(step_in_backward=True) with Trainer("
                f"accumulate_grad_batches={trainer.accumulate_grad_batches})"
                f"{' and a ' + type(scheduled[0]).__name__ if scheduled else ''}: a step in "
                f"backward cannot add up several backwards' gradients. Use "
                f"step_in_backward=False")
        if getattr(self.precision_plugin, "scaler", None) is not None:
            raise ValueError(
                f"torch_uvm: OffloadStrategy(step_in_backward=True) with precision="
                f"{trainer.precision!r}: a step in backward would use gradients the loss scaler "
                f"has scaled, before it checks them. Use bf16-mixed, or step_in_backward=False")

    def setup(self, trainer: "pl.Trainer") -> None:
        # Strategy.setup, but for the move of the optimizers' states to the GPU:
        # a streamed optimizer's states live in their homes
        self.check(trainer)
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.model = self._setup_model(self.model)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()


class OffloadDDPStrategy(Offloading, Settings, DDPStrategy):
    """Lightning's DDP, each rank's module (or its `submodule`) offloaded on
    the rank's GPU before DDP wraps it, and the optimizers streamed.
    Settings as Settings takes them (budget, submodule, host_step,
    non_blocking, offload's others); `ddp`: DDPStrategy's own arguments
    (``process_group_backend``, ``find_unused_parameters``, ...). The steps
    come after backward, once DDP has averaged the gradients:
    ``step_in_backward=True`` is refused."""

    strategy_name = "torch_uvm_offload_ddp"

    def __init__(self, budget=None, submodule: Optional[str] = None,
                 step_in_backward: bool = False, host_step: float = 0.0,
                 non_blocking: bool = False, ddp: Optional[dict] = None, **offload_options):
        if step_in_backward:
            raise ValueError(
                "torch_uvm: OffloadDDPStrategy(step_in_backward=True): each submodule would "
                "step during backward on this rank's own gradients, before DDP averages them, "
                "and the replicas would drift apart. Leave step_in_backward False (the steps "
                "come after backward), or train on one GPU with OffloadStrategy")
        ddp = dict(ddp or {})
        for name, why in (("gradient_as_bucket_view", "would make each gradient a view of "
                           "DDP's bucket on the GPU, not its home"),
                          ("model_averaging_period", "averages the parameters by replacing "
                           "their storage, which the offload holds")):
            if ddp.get(name):
                raise ValueError(f"torch_uvm: OffloadDDPStrategy(ddp={{{name!r}: "
                                 f"{ddp[name]!r}}}): it {why}. Leave it out")
        super().__init__(**ddp)
        self.keep_settings(budget, submodule, False, host_step, non_blocking, offload_options)

    def setup(self, trainer: "pl.Trainer") -> None:
        # DDPStrategy.setup, but for the move of the optimizers' states to the GPU:
        # a streamed optimizer's states live in their homes
        if trainer.state.fn != TrainerFn.FITTING:     # (no optimizers: DDP's own)
            super().setup(trainer)
            return
        if self._layer_sync is not None:
            raise ValueError(
                "torch_uvm: OffloadDDPStrategy with Trainer(sync_batchnorm=True): Lightning "
                "swaps the batch norms for SyncBatchNorm ones and back, around the offload's "
                "own tensors. Leave sync_batchnorm off")
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.configure_ddp()                 # DDP wraps the offloaded module
        self.setup_optimizers(trainer)
        self.setup_precision_plugin()
