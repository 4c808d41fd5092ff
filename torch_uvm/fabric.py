"""Lightning Fabric streaming a model larger than the GPU, by its strategy,
with the model and optimizer made as for any Fabric:

    from torch_uvm.fabric import OffloadFabricStrategy
    fabric = L.Fabric(accelerator="gpu", devices=1,
                      strategy=OffloadFabricStrategy(budget="8GiB"))
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)

Where Fabric's single-device strategy moves the module to its GPU, this one
offloads it (or its submodule `submodule`, the rest then moved as usual),
and it streams each optimizer ``setup`` (or ``setup_optimizers``) is given:
one made over the model's parameters before setup (its parameters are
then rebound to those offload put in their place) or after. ``fabric.backward``, ``clip_gradients`` and ``optimizer.step()`` work
as usual. The device is the one given, or else Fabric's one device
(``devices=[1]`` is cuda:1). ``handle`` is the offload's handle, and
``handle.undo()`` gives the model back. Imports lightning: only for those
who use it."""
from __future__ import annotations

import torch
from lightning.fabric.strategies import SingleDeviceStrategy

from .strategy_settings import StrategySettings
from .offload import offload


class OffloadFabricStrategy(StrategySettings, SingleDeviceStrategy):
    """Settings as StrategySettings takes them (budget, device, submodule,
    step_in_backward, host_step, non_blocking, offload's others); the
    device defaults to Fabric's one."""

    RUNNER = "Fabric"

    def module_to_device(self, module: torch.nn.Module) -> None:
        """Offloads `module` (or its `submodule`) where Fabric would move it,
        and moves the rest. One model per strategy: a second is refused."""
        target = module.get_submodule(self.submodule) if self.submodule else module
        if self.handle is not None and self.handle.offloaded:
            if self.handle.module is target:
                return                 # (set up again: it is where it should be)
            raise ValueError(
                f"torch_uvm: OffloadFabricStrategy offloads one model, and "
                f"{type(self.handle.module).__name__} is offloaded already: make a Fabric "
                f"(and strategy) for each model, or handle.undo() the first")
        self.handle = offload(target, budget=self.budget, device=self.root_device,
                              **self.offload_options)
        module.to(self.root_device)    # the rest; the offloaded part stays

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """After module_to_device (``fabric.setup``'s move): refuses a module
        set up without it (``move_to_device=False``), which stays where it is."""
        if self.handle is None or not self.handle.offloaded or \
                not any(m is self.handle.module for m in module.modules()):
            raise ValueError(
                "torch_uvm: OffloadFabricStrategy places the model by offloading it where "
                "Fabric moves it to the device, and this one was not moved: keep "
                "move_to_device=True in fabric.setup / setup_module")
        return module

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Streams `optimizer` through the model's offload (set the model
        up first: ``fabric.setup(model, optimizer)`` does)."""
        if self.handle is None or not self.handle.offloaded:
            raise ValueError(
                "torch_uvm: OffloadFabricStrategy streams an optimizer through the model's "
                "offload, and no model is set up yet: call fabric.setup(model, optimizer), or "
                "fabric.setup_module(model) before fabric.setup_optimizers(optimizer)")
        if not self.handle.streams(optimizer):
            before = [g["params"] for g in optimizer.param_groups]
            self.handle.rebind_optimizer(optimizer)   # (made before setup: the originals)
            try:
                self.handle.stream_optimizer(optimizer, **self.stream)
            except BaseException:                    # refused: the optimizer as it was
                for g, params in zip(optimizer.param_groups, before):
                    g["params"] = params
                raise
        return optimizer
