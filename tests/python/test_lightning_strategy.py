"""OffloadStrategy (torch_uvm/lightning.py) in a real Lightning Trainer on
the CPU, with a stand-in for offload: what it offloads, when, which
optimizers it streams, and what it refuses before anything is offloaded.
Streaming itself, against all-resident, is
examples/training/lightning_trainer.py (test_gpu_examples.py)."""
import pytest
import torch

L = pytest.importorskip("lightning")

from torch_uvm import lightning as tl  # noqa: E402


class StandIn:
    """What the strategy uses of an offload's handle."""

    def __init__(self, module):
        self.module, self.offloaded, self.streamed, self.settings = module, True, [], []
        self.rebound = []

    def rebind_optimizer(self, optimizer):
        self.rebound.append(optimizer)
        return optimizer

    def undo(self):
        self.offloaded = False

    def streams(self, optimizer):
        return any(o is optimizer for o in self.streamed)

    def stream_optimizer(self, optimizer, **settings):
        self.streamed.append(optimizer)
        self.settings.append(settings)
        return optimizer


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 1))
        self.head = torch.nn.Linear(1, 1)
        self.made = []

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(self.net(x)), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        self.made.append((optimizer, scheduler))
        return [optimizer], [scheduler]


def made_offloads(monkeypatch, module):
    """Puts a stand-in for offload in `module`; returns the list of each
    offload() it makes: (module, its arguments, its handle)."""
    made = []

    def fake(target, **kwargs):
        made.append((target, kwargs, StandIn(target)))
        return made[-1][2]
    monkeypatch.setattr(module, "offload", fake)
    return made


@pytest.fixture
def offloads(monkeypatch):
    """Each offload() the strategy makes: (module, its arguments, its handle)."""
    return made_offloads(monkeypatch, tl)


def loader():
    data = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
    return torch.utils.data.DataLoader(data, batch_size=4)


def trainer_of(strategy, **settings):
    return L.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=2, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, **settings)


def fit(model, strategy, **settings):
    trainer = trainer_of(strategy, **settings)
    trainer.fit(model, loader())
    return trainer


def test_it_offloads_the_module_and_streams_what_configure_optimizers_returns(offloads):
    model = Net()
    strategy = tl.OffloadStrategy(budget=1 << 20, device="cpu", host_step=0.5)
    trainer = fit(model, strategy)
    [(module, kwargs, handle)] = offloads
    assert module is model and kwargs["budget"] == 1 << 20
    [(optimizer, scheduler)] = model.made
    assert handle.streamed == [optimizer] and scheduler.optimizer is optimizer
    assert handle.settings == [{"step_in_backward": False, "host_step": 0.5,
                                "non_blocking": False}]
    # (the stand-in stays offloaded through teardown, where a real one is undone by its .cpu())
    trainer.fit(model, loader())             # undone first: no optimizer streamed twice
    assert not handle.offloaded and len(offloads) == 2
    assert [len(h.streamed) for _, _, h in offloads] == [1, 1]


def test_a_named_submodule_is_offloaded_alone(offloads):
    model = Net()
    fit(model, tl.OffloadStrategy(budget=1 << 20, device="cpu", submodule="net"))
    [(module, _, _)] = offloads
    assert module is model.net


@pytest.mark.parametrize("trainer, match", [
    ({"gradient_clip_val": 1.0}, "gradient_clip_val=1.0"),
    ({"accumulate_grad_batches": 2}, "accumulate_grad_batches=2"),
    ({"callbacks": [L.pytorch.callbacks.GradientAccumulationScheduler({0: 4})]},
     "and a GradientAccumulationScheduler"),
    ({"plugins": [L.pytorch.plugins.precision.MixedPrecision(     # (on a GPU: precision="16-mixed")
        "16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]}, "the loss scaler"),
])
def test_what_a_step_in_backward_cannot_keep_is_refused_before_anything_is_offloaded(
        offloads, trainer, match):
    with pytest.raises(ValueError, match=match):
        fit(Net(), tl.OffloadStrategy(budget=1 << 20, device="cpu", step_in_backward=True),
            **trainer)
    assert offloads == []


def test_it_streams_on_the_device_the_trainer_names(offloads):
    """Without device=, the strategy takes the Trainer's one device, which
    Lightning gives it as the Trainer is made (devices=[1] means cuda:1)."""
    fit(Net(), tl.OffloadStrategy(budget=1 << 20))
    [(_, kwargs, _)] = offloads
    assert kwargs["device"] == torch.device("cpu")
    strategy = tl.OffloadStrategy(budget=1 << 20)
    assert strategy.root_device == torch.device("cuda:0")          # before a Trainer
    strategy.parallel_devices = [torch.device("cuda:1")]           # Trainer(devices=[1])
    assert strategy.root_device == torch.device("cuda:1")
    chosen = tl.OffloadStrategy(budget=1 << 20, device="cuda:1")
    chosen.parallel_devices = [torch.device("cuda:0"), torch.device("cuda:1")]   # devices="auto"
    assert chosen.root_device == torch.device("cuda:1")


@pytest.mark.parametrize("strategy, devices, match", [
    ({}, 2, "streams the model through one GPU, and the Trainer has 2 devices"),
    ({"device": "cuda:1"}, 1, r"OffloadStrategy\(device='cuda:1'\) is not among the Trainer's"),
])
def test_a_device_the_strategy_cannot_take_is_refused_as_the_trainer_is_made(
        offloads, strategy, devices, match):
    with pytest.raises(ValueError, match=match):
        L.Trainer(accelerator="cpu", devices=devices, logger=False,
                  strategy=tl.OffloadStrategy(budget=1 << 20, **strategy))
    assert offloads == []


class Wrapped(L.Callback):
    """What the Trainer holds as training starts."""

    def on_train_start(self, trainer, module):
        self.model = trainer.strategy.model


def test_ddp_offloads_each_ranks_module_before_ddp_wraps_it_and_streams_its_optimizers(
        offloads, monkeypatch):
    import torch.distributed as dist
    model, seen = Net(), Wrapped()
    strategy = tl.OffloadDDPStrategy(budget=1 << 20, host_step=0.5,
                                     ddp={"process_group_backend": "gloo"})
    made, wrapped_then = tl.offload, []

    def offload(target, **kwargs):      # (what DDP held as the module was offloaded)
        wrapped_then.append(isinstance(strategy.model, torch.nn.parallel.DistributedDataParallel))
        return made(target, **kwargs)
    monkeypatch.setattr(tl, "offload", offload)
    try:
        fit(model, strategy, callbacks=[seen])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    [(module, kwargs, handle)] = offloads
    assert module is model and kwargs["device"] == torch.device("cpu")   # (the rank's device)
    assert wrapped_then == [False]                       # offloaded, then wrapped by DDP
    assert isinstance(seen.model, torch.nn.parallel.DistributedDataParallel)
    assert seen.model.module is model
    [(optimizer, _)] = model.made
    assert handle.streamed == [optimizer]
    assert handle.settings == [{"step_in_backward": False, "host_step": 0.5,
                                "non_blocking": False}]


def test_ddp_refuses_a_step_in_backward_as_the_strategy_is_made(offloads):
    with pytest.raises(ValueError, match=r"before DDP averages them.*Leave step_in_backward "
                                         r"False"):
        tl.OffloadDDPStrategy(budget=1 << 20, step_in_backward=True)


def test_several_devices_for_the_one_gpu_strategy_name_the_ddp_one(offloads):
    with pytest.raises(ValueError, match=r"has 2 devices.*OffloadDDPStrategy"):
        L.Trainer(accelerator="cpu", devices=2, logger=False,
                  strategy=tl.OffloadStrategy(budget=1 << 20))


@pytest.mark.parametrize("make", [
    lambda: tl.OffloadStrategy(budget=1 << 20, device="cpu"),
    lambda: tl.OffloadDDPStrategy(budget=1 << 20, ddp={"process_group_backend": "gloo"})])
def test_teardown_leaves_the_streamed_optimizers_states_in_their_homes(offloads, monkeypatch,
                                                                       make):
    """Lightning's teardown moves the optimizers' states to the CPU before
    the module; a streamed optimizer's states are in their homes, which the
    module's move (the offload's undo) gives back in place: not moved first,
    which would copy every state."""
    import torch.distributed as dist
    import lightning.pytorch.strategies.strategy as base
    moved, own = [], base._optimizers_to_device
    monkeypatch.setattr(base, "_optimizers_to_device",
                        lambda optimizers, device: (moved.append(list(optimizers)),
                                                    own(optimizers, device)))
    model = Net()
    try:
        trainer = fit(model, make())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    [(optimizer, _)] = model.made
    assert all(optimizer not in m for m in moved) and moved        # (teardown ran)
    assert trainer.strategy.optimizers == [optimizer]               # given back after


@pytest.mark.parametrize("settings, match", [
    ({"ddp": {"gradient_as_bucket_view": True}}, "a view of DDP's bucket on the GPU"),
    ({"ddp": {"model_averaging_period": 4}}, "by replacing their storage"),
])
def test_ddp_settings_that_would_bypass_the_homes_are_refused_as_the_strategy_is_made(
        offloads, settings, match):
    with pytest.raises(ValueError, match=match):
        tl.OffloadDDPStrategy(budget=1 << 20, **settings)


def test_a_setting_offload_does_not_take_is_refused_as_the_strategy_is_made(offloads):
    for make in (tl.OffloadStrategy, tl.OffloadDDPStrategy):
        with pytest.raises(TypeError, match=r"got 'find_unused_parameters', which offload\(\) "
                                            r"does not take .*ddp=\{\.\.\.\}"):
            make(budget=1 << 20, find_unused_parameters=True)


def test_ddp_with_sync_batchnorm_is_refused_before_anything_is_offloaded(offloads):
    import torch.distributed as dist
    try:
        with pytest.raises(ValueError, match="sync_batchnorm=True"):
            fit(Net(), tl.OffloadDDPStrategy(budget=1 << 20,
                                             ddp={"process_group_backend": "gloo"}),
                sync_batchnorm=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert offloads == []
