"""OffloadFabricStrategy (torch_uvm/fabric.py) in a real Lightning Fabric on
the CPU, with a stand-in for offload: what it offloads, when, which
optimizers it streams, and what it refuses before anything is offloaded.
Streaming itself, against all-resident, is
examples/training/lightning_fabric.py (test_gpu_examples.py)."""
import pytest
import torch

L = pytest.importorskip("lightning")

from torch_uvm import fabric as tf  # noqa: E402
from test_lightning_strategy import StandIn, made_offloads  # noqa: E402


@pytest.fixture
def offloads(monkeypatch):
    """Each offload() the strategy makes: (module, its arguments, its handle)."""
    return made_offloads(monkeypatch, tf)


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def fabric_of(strategy, devices=1):
    return L.Fabric(accelerator="cpu", devices=devices, strategy=strategy)


def test_setup_offloads_the_model_and_streams_its_optimizer_made_before(offloads):
    strategy = tf.OffloadFabricStrategy(budget=1 << 20, step_in_backward=True)
    fabric = fabric_of(strategy)
    model = net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)   # before setup, as users do
    fabric_model, fabric_optimizer = fabric.setup(model, optimizer)
    [(module, kwargs, handle)] = offloads
    assert module is model and kwargs["budget"] == 1 << 20
    assert kwargs["device"] == torch.device("cpu")                # Fabric's one device
    assert handle.streamed == [optimizer] and strategy.handle is handle
    assert handle.rebound == [optimizer]          # its parameters: those offload put in place
    assert handle.settings == [{"step_in_backward": True, "host_step": 0.0,
                                "non_blocking": False}]
    loss = fabric_model(torch.randn(4, 8)).square().mean()        # the loop, as users write it
    fabric.backward(loss)
    fabric_optimizer.step()
    fabric_optimizer.zero_grad()


def test_a_model_and_its_optimizers_set_up_apart_are_streamed_too(offloads):
    strategy = tf.OffloadFabricStrategy(budget=1 << 20, submodule="0")
    fabric = fabric_of(strategy)
    model = net()
    fabric.setup_module(model)
    first, second = (torch.optim.SGD(model.parameters(), lr=0.1) for _ in range(2))
    fabric.setup_optimizers(first, second)
    [(module, _, handle)] = offloads
    assert module is model[0]                                      # the submodule alone
    assert handle.streamed == [first, second]
    fabric.setup_module(model)                                     # again: nothing new
    assert len(offloads) == 1


@pytest.mark.parametrize("how, match", [
    ("optimizer first", "no model is set up yet"),
    ("not moved", "keep move_to_device=True"),
    ("second model", "offloads one model"),
])
def test_what_the_strategy_cannot_set_up_is_refused(offloads, how, match):
    fabric = fabric_of(tf.OffloadFabricStrategy(budget=1 << 20))
    model = net()
    with pytest.raises(ValueError, match=match):
        if how == "optimizer first":
            fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
        elif how == "not moved":
            fabric.setup_module(model, move_to_device=False)
        else:
            fabric.setup_module(model)
            fabric.setup_module(net())
    assert len(offloads) == (1 if how == "second model" else 0)


def test_a_fabric_of_several_devices_is_refused_as_it_is_made(offloads):
    with pytest.raises(ValueError, match="OffloadFabricStrategy streams the model through one "
                                         "GPU, and the Fabric has 2 devices"):
        fabric_of(tf.OffloadFabricStrategy(budget=1 << 20), devices=2)


def test_a_refused_optimizer_made_before_setup_is_left_as_it_was(monkeypatch):
    """The strategy rebinds an optimizer made before setup, then streams it:
    if streaming refuses it, its groups are put back as they were."""
    class Refusing(StandIn):
        def rebind_optimizer(self, optimizer):
            for g in optimizer.param_groups:
                g["params"] = [torch.nn.Parameter(p.detach().clone()) for p in g["params"]]
            return optimizer

        def stream_optimizer(self, optimizer, **settings):
            raise ValueError("torch_uvm: refused for the test")
    monkeypatch.setattr(tf, "offload", lambda target, **kwargs: Refusing(target))
    fabric = fabric_of(tf.OffloadFabricStrategy(budget=1 << 20))
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = list(optimizer.param_groups[0]["params"])
    with pytest.raises(ValueError, match="refused for the test"):
        fabric.setup(model, optimizer)
    assert all(a is b for a, b in zip(optimizer.param_groups[0]["params"], before))
