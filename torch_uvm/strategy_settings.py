"""What torch_uvm's Lightning strategies (the Trainer's and Fabric's) take:
offload's and stream_optimizer's settings, and the one GPU they stream
through: the one given (``device=``), or else the Trainer's (or Fabric's)
one device, which Lightning gives a strategy that has ``parallel_devices``
as the Trainer is made (``devices=[1]`` is cuda:1), or else cuda:0.
Imports no Lightning."""
from __future__ import annotations

from typing import List, Optional

import torch


class OneDevice:
    """A mixin before Lightning's single-device strategy: ``root_device``
    and ``parallel_devices`` as said above. Call ``choose_device(device)``
    first in ``__init__``."""

    RUNNER = "Trainer"      # what the user names its devices to, in the errors
    SEVERAL = "offload each replica under DDP: docs/training.md"   # what several devices take

    def choose_device(self, device) -> torch.device:
        """Keeps `device` (None: the Trainer's); returns what the base's
        ``__init__`` takes until the Trainer says."""
        self._given = None if device is None else torch.device(device)
        self._trainer_devices: List[torch.device] = []
        return self._given or torch.device("cuda:0")

    @property
    def root_device(self) -> torch.device:
        """The device given, or else the Trainer's one, or else cuda:0."""
        if self._given is not None:
            return self._given
        return self._trainer_devices[0] if self._trainer_devices else torch.device("cuda:0")

    @property
    def parallel_devices(self) -> List[torch.device]:
        return self._trainer_devices

    @parallel_devices.setter
    def parallel_devices(self, devices) -> None:
        """The Trainer's devices (``Trainer(devices=...)``): one, or several
        among which the `device` given."""
        devices = [torch.device(d) for d in (devices or [])]
        name = type(self).__name__
        if self._given is not None and devices and self._given not in devices:
            raise ValueError(
                f"torch_uvm: {name}(device={str(self._given)!r}) is not among the "
                f"{self.RUNNER}'s devices ({', '.join(map(str, devices))}): give the device in "
                f"one place ({self.RUNNER}(devices=[k]) alone is enough)")
        if self._given is None and len(devices) > 1:
            raise ValueError(
                f"torch_uvm: {name} streams the model through one GPU, and the {self.RUNNER} "
                f"has {len(devices)} devices ({', '.join(map(str, devices))}): pass devices=1 "
                f"or devices=[k] to the {self.RUNNER}, or device= to the strategy (for data "
                f"parallel training, {self.SEVERAL})")
        self._trainer_devices = devices


class Settings:
    """offload's and stream_optimizer's settings, as a strategy keeps them:
    `budget`, `ahead`, `mode`, `units`, `checkpoint`: offload's;
    `step_in_backward`, `host_step`, `non_blocking`: stream_optimizer's;
    `submodule`: the name of the part to offload (default: all of it)."""

    def keep_settings(self, budget, submodule: Optional[str], step_in_backward: bool,
                      host_step: float, non_blocking: bool, offload_options: dict) -> None:
        import inspect
        from .offload import offload
        taken = set(inspect.signature(offload).parameters) - {"module", "budget", "device"}
        unknown = sorted(set(offload_options) - taken)
        if unknown:
            raise TypeError(
                f"torch_uvm: {type(self).__name__} got {', '.join(map(repr, unknown))}, which "
                f"offload() does not take (it takes {', '.join(sorted(taken))}). A strategy's "
                f"own arguments go in its own place (OffloadDDPStrategy: ddp={{...}})")
        self.budget, self.submodule = budget, submodule
        self.stream = dict(step_in_backward=step_in_backward, host_step=host_step,
                           non_blocking=non_blocking)
        self.offload_options = offload_options
        self.handle = None       # the offload's, once set up


class StrategySettings(OneDevice, Settings):
    """Before a single-device strategy of Lightning's: Settings', and
    `device`, as OneDevice says."""

    def __init__(self, budget=None, device=None, submodule: Optional[str] = None,
                 step_in_backward: bool = False, host_step: float = 0.0,
                 non_blocking: bool = False, **offload_options):
        super().__init__(device=self.choose_device(device))
        self.keep_settings(budget, submodule, step_in_backward, host_step, non_blocking,
                           offload_options)
