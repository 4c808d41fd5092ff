"""stream_optimizer(host_step=): the later streamed submodules step on the
host, with PyTorch's fused CPU AdamW over their homes, while the GPU steps
the rest. Each loop runs against a reference written as a user would: all
resident, the same submodules stepped by AdamW(fused=True) on CPU copies
of their weights, the others by the optimizer on the GPU. Losses and
weights must agree bit for bit; where the moments live is asked of the
driver."""
import threading
import time

import pytest
import torch

from conftest import gpu, where
from offload_helpers import make_model
# (nothing_left_streamed: the loops' autouse fixture, which undoes what a test left)
from test_gpu_training_loops import MiB, _SleepInBackward, data, nothing_left_streamed, train  # noqa: F401

pytestmark = gpu


def reference(build, batches, on_host, lr=1e-3):
    """All resident; the parameters named in `on_host` step on CPU copies
    with AdamW(fused=True), copied back after each step."""
    model = build().cuda()
    named = dict(model.named_parameters())
    on_gpu = [p for n, p in named.items() if n not in on_host]
    gpu_opt = torch.optim.AdamW(on_gpu, lr=lr) if on_gpu else None
    masters = {n: named[n].detach().cpu().clone().requires_grad_() for n in on_host}
    cpu_opt = torch.optim.AdamW(list(masters.values()), lr=lr, fused=True)
    losses = []
    for x in batches:
        loss = model(x).square().mean()
        loss.backward()
        if gpu_opt is not None:
            gpu_opt.step()
        for n, m in masters.items():
            m.grad = named[n].grad.cpu()
        cpu_opt.step()
        with torch.no_grad():
            for n, m in masters.items():
                named[n].copy_(m)
        model.zero_grad()
        losses.append(loss.item())
    return losses, model


def host_names(handle):
    return {f"{u.name}.{k}" for u in handle.host_stepped_units()
            for k, p in u.module.named_parameters() if p.requires_grad}


def against_reference(uvm, build, share, in_backward, batches, non_blocking=False):
    """`build()` offloaded under 24 MiB, trained with host_step=`share`;
    its losses and weights equal the reference's. Returns the handle and
    the optimizer."""
    model = build()
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                        step_in_backward=in_backward, host_step=share,
                                        non_blocking=non_blocking)
    got, _ = train(model, optimizer, batches)
    handle.wait_for_host_steps()
    torch.cuda.synchronize()
    want, resident = reference(build, batches, host_names(handle))
    assert got == want
    for (name, p), q in zip(model.named_parameters(), resident.parameters()):
        assert torch.equal(p, q), name
    return handle, optimizer


in_backward = pytest.mark.parametrize("in_backward", [False, True],
                                      ids=["step_after", "step_in_backward"])


@in_backward
@pytest.mark.parametrize("share", [0.5, 1.0])
def test_a_host_step_gives_a_fused_cpu_steps_weights_and_keeps_its_moments_home(
        uvm, in_backward, share):
    handle, optimizer = against_reference(uvm, lambda: make_model(layers=8, width=1024),
                                          share, in_backward, data(3))
    model = handle.module
    on_host = handle.host_stepped_units()
    streamed = [u for u in handle.units_in_order() if u not in handle.resident_units()]
    # the last streamed units, `share` of them (all the same size)
    assert on_host == streamed[::-1][:int(share * len(streamed) + 0.5)] and on_host
    # the moments of the host's units never came to the GPU: the driver finds
    # them in host memory; the GPU's units' went home after their steps too
    for u in on_host:
        w = u.module.weight
        assert where(optimizer.state[w]["exp_avg"]) == "host"
        assert where(optimizer.state[w]["exp_avg_sq"]) == "host"
        assert where(w) == "host"
    # and were never streamed: only the GPU-stepped weights' moments were
    gpu_stepped = [u for u in handle.units if u not in on_host]
    weights = len(list(model.parameters()))
    assert handle.executor.streamed_tensors() == 2 * weights + 2 * len(gpu_stepped)
    assert handle.residency_stats()["resident_bytes.peak"] <= 24 * MiB


class Sleeps(torch.nn.Module):
    """Identity; its backward puts the GPU to sleep (test_gpu_training_loops'
    _SleepInBackward), so the host runs ahead of what comes after it."""

    def forward(self, x):
        return _SleepInBackward.apply(x)


@in_backward
def test_a_host_step_waits_for_its_gradients_copy_home(uvm, in_backward):
    """The last layer's backward comes after the GPU's sleep: its gradients'
    hook runs, and their copy home is queued, long before the GPU computes
    them. A host step that read the homes then would step on the last
    step's gradients."""
    def build():
        return torch.nn.Sequential(*make_model(layers=8, width=1024), Sleeps())
    against_reference(uvm, build, 1.0, in_backward, data(3))


@pytest.mark.parametrize("variable, share", [(None, 1 / 8), ("0.5", 0.5)])
def test_the_backward_bounds_the_gradients_copying_home_by_a_share_of_the_budget(
        uvm, monkeypatch, variable, share):
    """Each host-stepped submodule's gradients, once their copy home is
    queued in backward, count against a share of the budget: an eighth, or
    TORCH_UVM_HOST_STEP_COPIES's as stream_optimizer found it. The GPU
    sleeps first in each backward, so the copies are still under way when
    the host looks, however fast the GPU and whatever shares it."""
    from torch_uvm import host_step
    if variable is None:
        monkeypatch.delenv(host_step.COPIES_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(host_step.COPIES_VARIABLE, variable)
    model = torch.nn.Sequential(*make_model(layers=8, width=1024), Sleeps())
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()),
                                        step_in_backward=True, host_step=1.0)
    # the most one submodule's gradients take (the newest copy may pass the limit alone)
    per_unit = max(sum(p.nbytes for p in m.parameters(recurse=False)) for m in model.modules())
    seen, most, real = [], [], host_step.HostSteps._limit_copies

    def counted(self, executor, limit):
        real(self, executor, limit)
        under_way = executor.copies_home_under_way()
        seen.append(limit)
        most.append(under_way)
        assert under_way <= max(limit, per_unit)
    monkeypatch.setattr(host_step.HostSteps, "_limit_copies", counted)
    monkeypatch.setenv(host_step.COPIES_VARIABLE, "1")   # read once, by stream_optimizer
    train(model, optimizer, data(3))
    on_host = handle.host_stepped_units()
    # (the units are alike; a step learns the plan first: at least one backward's)
    assert len(seen) >= len(on_host) > 0
    assert set(seen) == {int(share * 24 * MiB)}
    assert max(most) > 0            # the copies home were on the books when it looked


@in_backward
def test_step_returns_with_every_host_step_done(uvm, in_backward, monkeypatch):
    """As torch.optim promises: after optimizer.step() the weights are
    stepped, whatever the host's pace (each host step made slow here)."""
    from torch_uvm import host_step
    model = make_model(layers=8, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()),
                                        step_in_backward=in_backward, host_step=1.0)
    train(model, optimizer, data(1))
    done, real = [], host_step._adam_on_cpu

    def slow(*args, **kwargs):
        time.sleep(0.2)
        real(*args, **kwargs)
        done.append(1)
    monkeypatch.setattr(host_step, "_adam_on_cpu", slow)
    model(data(1)[0]).square().mean().backward()
    optimizer.step()
    assert len(done) == len(handle.host_stepped_units()) > 0


@in_backward
def test_a_non_blocking_step_returns_first_and_each_forward_waits_for_its_own(
        uvm, in_backward, monkeypatch):
    """non_blocking: optimizer.step() returns while the host's steps are held
    back; the host then steps first what the next forward runs first; each
    submodule's forward begins after its own step, nothing is brought from
    a home its step is writing (each host step made slow here, so the
    forward overtakes the host), and a learning rate changed after step()
    reaches the next step only: the losses and weights are the blocking
    reference's, bit for bit."""
    from torch_uvm import _C, host_step
    build = lambda: make_model(layers=8, width=1024)   # noqa: E731
    batches = data(4)
    model = build()
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                        step_in_backward=in_backward, host_step=1.0,
                                        non_blocking=True)
    got, _ = train(model, optimizer, batches[:1])      # planned: the host's units known
    handle.wait_for_host_steps()
    on_host = handle.host_stepped_units()
    order = [u for u in handle.units_in_order() if u in on_host]
    assert len(on_host) >= 3
    by_home = {_C.home_on_cpu(u.module.weight).data_ptr(): u.name for u in on_host}
    events, gate, real = [], threading.Event(), host_step._adam_on_cpu

    def held_then_slow(decoupled, group, params, *args, **kwargs):
        assert gate.wait(timeout=60)
        time.sleep(0.02)
        real(decoupled, group, params, *args, **kwargs)
        events.extend(("stepped", by_home[p.data_ptr()]) for p in params
                      if p.data_ptr() in by_home)
    monkeypatch.setattr(host_step, "_adam_on_cpu", held_then_slow)
    for u in on_host:
        u.module.register_forward_pre_hook(
            lambda module, args, name=u.name: events.append(("forward", name)))
    for k, x in enumerate(batches[1:]):
        loss = model(x).square().mean()
        if k == 1:        # a scheduler's change after the last step() reaches this one only
            for group in optimizer.param_groups:
                group["lr"] = 1e-3
        loss.backward()
        optimizer.step()
        if k == 0:
            # returned with none stepped
            assert handle.state.host_steps.pending and all(kind == "forward" for kind, _ in events)
            for group in optimizer.param_groups:
                group["lr"] = 10.0
            torch.cuda.synchronize()      # every gradient home: the host may choose any
            gate.set()
            # their gradients are the host's alone (None, whatever the loop does next)
            assert all(p.grad is None for u in on_host for p in u.module.parameters())
        optimizer.zero_grad()
        got.append(loss.item())
    handle.wait_for_host_steps()
    monkeypatch.undo()
    # the first step after the gate opened: the one the worker had taken,
    # then the others in the forward's order
    stepped = [k for k, (kind, _) in enumerate(events) if kind == "stepped"]
    first = [events[k][1] for k in stepped[:len(on_host)]]
    assert first[1:] == [u.name for u in order if u.name != first[0]]
    # and the next forward ran while the host still stepped: its first
    # submodule came before the host's last step of the one before
    forwards = [k for k, (kind, _) in enumerate(events) if kind == "forward"]
    assert forwards[len(on_host)] < stepped[len(on_host) - 1]
    for u in on_host:          # each forward after its own step, in both steps
        seen = [kind for kind, name in events if name == u.name]
        assert seen == ["forward"] + ["stepped", "forward"] * 2 + ["stepped"], (u.name, seen)
    want, resident = reference(build, batches, host_names(handle))
    assert got == want
    for (name, p), q in zip(model.named_parameters(), resident.parameters()):
        assert torch.equal(p, q), name


def test_a_non_blocking_steps_error_raises_at_the_next_forward(uvm, monkeypatch):
    from torch_uvm import host_step
    model = make_model(layers=8, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()), host_step=1.0,
                                        non_blocking=True)
    train(model, optimizer, data(1))
    handle.wait_for_host_steps()

    gate = threading.Event()

    def fails(*args, **kwargs):
        assert gate.wait(timeout=20)
        raise MemoryError("no room")
    monkeypatch.setattr(host_step, "_adam_on_cpu", fails)
    model(data(1)[0]).square().mean().backward()
    optimizer.step()          # returns: no step has failed yet
    gate.set()
    with pytest.raises(RuntimeError, match=r"host step of submodule '.+' failed \(no room\)"):
        model(data(1)[0])     # the first host-stepped submodule's forward waits for its step
    monkeypatch.undo()
    try:
        handle.wait_for_host_steps()                  # those not waited for yet raise here
    except RuntimeError as e:
        assert "failed (no room)" in str(e)
    optimizer.zero_grad()
    train(model, optimizer, data(1))                  # and it trains on


def test_a_state_dict_loaded_after_a_non_blocking_step_is_not_stepped_over(uvm, monkeypatch):
    """The module's load_state_dict after a non-blocking step() waits for the
    host's steps (held back here until a timer lets them go): the values
    loaded are what the module holds after, not the host's stepped ones
    written over them; and its state_dict gives the stepped values."""
    from torch_uvm import host_step
    model = make_model(layers=8, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2),
                                        host_step=1.0, non_blocking=True)
    train(model, optimizer, data(1))
    handle.wait_for_host_steps()
    saved = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    gate, real = threading.Event(), host_step._adam_on_cpu

    def held(*args, **kwargs):
        assert gate.wait(timeout=20)
        real(*args, **kwargs)
    monkeypatch.setattr(host_step, "_adam_on_cpu", held)
    train(model, optimizer, data(1, seed=2))
    assert handle.state.host_steps.pending
    threading.Timer(0.2, gate.set).start()
    stepped = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    assert not handle.state.host_steps.pending
    assert any(not torch.equal(stepped[k], saved[k]) for k in saved)
    train(model, optimizer, data(1, seed=3))
    gate.clear()
    threading.Timer(0.2, gate.set).start()
    model.load_state_dict(saved)
    handle.wait_for_host_steps()
    for k, v in model.state_dict().items():
        assert torch.equal(v.detach().cpu(), saved[k]), k


def test_two_optimizers_of_one_offload_step_each_host_weight_once(uvm):
    """Weights in one AdamW, biases in another, each stepped after backward:
    each optimizer's step() steps its own parameters on the host, once."""
    batches = data(3)
    model = make_model(layers=8, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    weights = handle.stream_optimizer(
        torch.optim.AdamW([m.weight for m in model], lr=1e-3), host_step=1.0)
    biases = handle.stream_optimizer(torch.optim.AdamW([m.bias for m in model], lr=1e-3))
    got = []
    for x in batches:
        loss = model(x).square().mean()
        loss.backward()
        weights.step()
        biases.step()
        weights.zero_grad()
        biases.zero_grad()
        got.append(loss.item())
    torch.cuda.synchronize()
    want, resident = reference(lambda: make_model(layers=8, width=1024), batches,
                               host_names(handle))
    assert got == want
    for (name, p), q in zip(model.named_parameters(), resident.parameters()):
        assert torch.equal(p, q), name
    assert all(weights.state[u.module.weight]["step"].item() == 3
               for u in handle.host_stepped_units())


def test_a_checkpoint_taken_between_host_steps_resumes_them(uvm, tmp_path):
    """The optimizer's state_dict (the host's moments, as CPU tensors) saved
    after two steps and loaded into a new offload gives the third step of an
    uninterrupted run."""
    batches = data(3)

    def start():
        model = make_model(layers=8, width=1024)
        handle = uvm.offload(model, budget=24 * MiB)
        optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                            host_step=1.0)
        return model, handle, optimizer
    model, handle, optimizer = start()
    whole, _ = train(model, optimizer, batches)
    after = [p.detach().cpu() for p in model.parameters()]
    handle.undo()

    model, handle, optimizer = start()
    train(model, optimizer, batches[:2])
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
               tmp_path / "ckpt.pt")
    # the host's states saved as CPU tensors (never through the GPU)
    saved_state = optimizer.state_dict()["state"]
    ids = {id(p): i for i, p in enumerate(model.parameters())}
    on_host = [ids[id(p)] for u in handle.host_stepped_units() for p in u.trainable]
    assert on_host and all(t.device.type == "cpu" for i in on_host
                           for t in saved_state[i].values())
    handle.undo()

    model, handle, optimizer = start()
    saved = torch.load(tmp_path / "ckpt.pt")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    resumed, _ = train(model, optimizer, batches[2:])
    assert resumed == whole[2:]
    for p, q in zip(model.parameters(), after):
        assert torch.equal(p.detach().cpu(), q)


def test_a_failed_host_step_raises_at_step_naming_its_submodule(uvm, monkeypatch):
    from torch_uvm import host_step
    model = make_model(layers=8, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()), host_step=1.0)
    train(model, optimizer, data(1))                  # planned: the host's units known
    last = handle.host_stepped_units()[0]

    def fails(*args, **kwargs):
        raise MemoryError("no room")
    monkeypatch.setattr(host_step, "_adam_on_cpu", fails)
    model(data(1)[0]).square().mean().backward()
    with pytest.raises(RuntimeError, match=rf"host step of submodule '{last.name}' failed"):
        optimizer.step()
    monkeypatch.undo()
    optimizer.zero_grad()
    train(model, optimizer, data(1))                  # and it trains on


def test_host_step_is_refused_before_anything_changes(uvm):
    model = make_model(layers=2, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    for optimizer, share, error in [
            (torch.optim.SGD(model.parameters(), lr=0.1), 0.5, "fused CPU Adam/AdamW"),
            (torch.optim.AdamW(model.parameters()), 1.5, "from 0 .* to 1"),
            (torch.optim.AdamW(model.parameters()), "half", "from 0 .* to 1")]:
        with pytest.raises(ValueError, match=error):
            handle.stream_optimizer(optimizer, host_step=share)
        assert "step" not in optimizer.__dict__ and handle.host_step == 0
    for share, non_blocking, error in [(0.0, True, "steps nothing on the host"),
                                       (1.0, "yes", "True or False")]:
        optimizer = torch.optim.AdamW(model.parameters())
        with pytest.raises(ValueError, match=error):
            handle.stream_optimizer(optimizer, host_step=share, non_blocking=non_blocking)
        assert "step" not in optimizer.__dict__ and handle.host_step == 0
        assert not handle.state.host_steps.non_blocking
    handle.stream_optimizer(torch.optim.AdamW(model[0].parameters()), host_step=0.5)
    other = torch.optim.AdamW(model[1].parameters())
    with pytest.raises(ValueError, match="every optimizer of one offload takes the same"):
        handle.stream_optimizer(other, host_step=1.0)
    assert "step" not in other.__dict__ and handle.host_step == 0.5
    with pytest.raises(ValueError, match="every optimizer of one offload takes the same "
                                         "non_blocking"):
        handle.stream_optimizer(other, host_step=0.5, non_blocking=True)
    assert "step" not in other.__dict__ and not handle.state.host_steps.non_blocking
