"""Offloaded training in the loops users write: an evaluation first,
frozen parts, parameters unfrozen between steps, submodules that run in one
step and not the next, a closure, loaded optimizer states, parameters that
are not offloaded, and the errors each refuses up front. Every loop runs
twice, all resident and offloaded, and the losses and weights must agree bit
for bit; memory claims are checked by the driver (where each tensor is)."""
import io

import pytest
import torch

from conftest import gpu, memory_type, where
from offload_helpers import make_model, nothing_left_streamed  # noqa: F401 (autouse)

pytestmark = gpu
MiB = 1 << 20


def data(steps, rows=64, width=1024, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(rows, width, device="cuda", generator=g) for _ in range(steps)]


def train(model, optimizer, batches, evaluate=None, before=None, set_to_none=True):
    """The plain loop: forward, backward, step, zero_grad(set_to_none);
    `evaluate(model)` before, between and after the steps when given, and
    `before(i, model)` before step i's forward. Returns the losses and what
    each evaluation gave."""
    losses, seen = [], []
    for i, x in enumerate(batches):
        if evaluate is not None:
            seen.append(evaluate(model))
        if before is not None:
            before(i, model)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
        losses.append(loss.item())
    if evaluate is not None:
        seen.append(evaluate(model))
    return losses, seen


def both(uvm, build, loop, budget, make_optimizer=None, in_backward=False, **offload_kwargs):
    """`loop(model, optimizer)` on `build()` all resident, then offloaded
    under `budget` with a streamed optimizer: their results and weights must
    be equal bit for bit, and the share's books within the budget. Returns
    the handle (not undone: the caller looks, the fixture undoes)."""
    make_optimizer = make_optimizer or (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3))
    reference = build().cuda()
    want = loop(reference, make_optimizer(reference))
    model = build()
    handle = uvm.offload(model, budget=budget, **offload_kwargs)
    optimizer = handle.stream_optimizer(make_optimizer(model), step_in_backward=in_backward)
    got = loop(model, optimizer)
    torch.cuda.synchronize()
    assert equal(got, want)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert handle.residency_stats()["resident_bytes.peak"] <= budget
    return handle


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


in_backward = pytest.mark.parametrize("in_backward", [False, True],
                                      ids=["step_after", "step_in_backward"])


@in_backward
@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "eval_with_grad"])
def test_an_evaluation_first_then_training_gives_the_all_resident_losses(uvm, in_backward, how):
    """Lightning's sanity check, or a user's evaluate() before train(): the
    first forward plans for inference; the first that builds a graph plans
    again for training (a resident prefix: backward ends there)."""
    batches = data(3)
    probe = torch.randn(8, 1024, device="cuda")

    def evaluate(model):
        model.eval()
        if how == "no_grad":
            with torch.no_grad():
                out = model(probe)
        elif how == "inference_mode":
            with torch.inference_mode():
                out = model(probe).clone()
        else:                         # eval() alone: a graph is built, never used
            out = model(probe).detach()
        model.train()
        return out

    handle = both(uvm, lambda: make_model(width=1024), lambda m, o: train(m, o, batches, evaluate),
                  budget=24 * MiB, in_backward=in_backward)
    assert handle.training and handle.mode == "prefetch"
    order, resident = handle.units_in_order(), handle.resident_units()
    assert order[:len(resident)] == resident


class Experts(torch.nn.Module):
    """A mixture of experts whose routing picks another expert each call."""

    def __init__(self, experts=8, width=1024):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(width, width)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(width, width)
                                           for _ in range(experts))
        self.out = torch.nn.Linear(width, width)
        self.calls = 0

    def forward(self, x):
        expert = self.experts[(3 * self.calls) % len(self.experts)]
        self.calls += 1
        return self.out(torch.relu(expert(self.inp(x))))


@in_backward
def test_experts_not_routed_to_let_go_of_what_was_brought_for_them(uvm, in_backward):
    batches = data(6)
    handle = both(uvm, Experts, lambda m, o: train(m, o, batches), budget=24 * MiB,
                  in_backward=in_backward)
    # between steps nothing streamed is held: what a pass brought ahead for
    # an expert it then skipped was let go
    assert handle.executor.holders().startswith("no streamed unit")


def test_inference_with_routing_that_changes_each_pass_stays_within_its_budget(uvm):
    x = torch.randn(16, 1024, device="cuda")
    reference = Experts().cuda()
    with torch.no_grad():
        want = [reference(x) for _ in range(24)]
    model = Experts()
    handle = uvm.offload(model, budget=16 * MiB, mode="prefetch")
    got, staged = [], []
    with torch.no_grad():
        for _ in range(24):
            got.append(model(x))
            staged.append(len(handle.executor.staged()))
    torch.cuda.synchronize()
    assert equal(got, want)
    assert handle.residency_stats()["resident_bytes.peak"] <= 16 * MiB
    # what a pass brought ahead and then skipped does not pile up: only what
    # the last unit brought for the next pass (ahead = 1: one expert's bytes)
    assert max(staged) <= 1


class EarlyExit(torch.nn.Module):
    """Eight layers; after two full passes, each pass stops one layer
    earlier than the last (7, 6, 5, 4, 3, then 7 again): the layer the last
    one ran brought ahead is never run."""

    def __init__(self, layers=8, width=1024):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.calls = 0

    def forward(self, x):
        depth = len(self.layers) if self.calls < 2 else 7 - (self.calls - 2) % 5
        self.calls += 1
        for layer in self.layers[:depth]:
            x = torch.relu(layer(x))
        return x


def test_inference_that_exits_early_gives_the_all_resident_outputs(uvm):
    """Each early exit leaves the next layer brought ahead and never run: the
    outputs equal all resident's bit for bit, and what is brought ahead
    never piles up beyond one window (ahead = 1), whatever the exits."""
    x = torch.randn(16, 1024, device="cuda")
    reference = EarlyExit().cuda()
    with torch.no_grad():
        want = [reference(x) for _ in range(12)]
    model = EarlyExit()
    handle = uvm.offload(model, budget=16 * MiB, mode="prefetch")
    got, staged = [], []
    with torch.no_grad():
        for _ in range(12):
            got.append(model(x))
            staged.append(len(handle.executor.staged()))
    torch.cuda.synchronize()
    assert equal(got, want)
    assert max(staged[2:]) <= 1, staged


class Skips(torch.nn.Module):
    """Twelve layers; every other call skips layer 1 (a conditional branch)."""

    def __init__(self, layers=12, width=1024, skipped=1):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.skipped, self.calls = skipped, 0

    def forward(self, x):
        skip = self.calls % 2 == 1
        self.calls += 1
        for i, layer in enumerate(self.layers):
            if not (skip and i == self.skipped):
                x = torch.relu(layer(x))
        return x


def test_a_unit_brought_ahead_and_skipped_leaves_room_to_bring_the_next_ones_ahead(uvm):
    """A pass that skips a unit it brought ahead lets go of it once it has
    gone past: the unit after the skipped one comes on demand (nothing
    brought it), and every later one is brought ahead again. Kept held, the
    skipped unit fills the window, and the next unit's bring ahead finds no
    room: it too comes on demand. Which brings came ahead and which on
    demand is read from torch.profiler's trace (torch_uvm::bring_ahead and
    torch_uvm::bring ranges), not from the executor's books."""
    import json
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(16, 1024, device="cuda")
    reference = Skips().cuda()
    with torch.no_grad():
        want = [reference(x) for _ in range(8)]
    model = Skips()
    # 24 MiB: 3 layers resident beside a window of 2 (ahead = 1), and less
    # than a layer to spare
    handle = uvm.offload(model, budget=24 * MiB, mode="prefetch")
    got = []
    with torch.no_grad():
        for _ in range(2):                               # learns the order; plans
            got.append(model(x))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for k in range(6):                           # skip, full, skip, ...
                with torch.profiler.record_function(f"pass {k}"):
                    got.append(model(x))
            torch.cuda.synchronize()
    assert equal(got, want)
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/trace.json"
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = sorted((e for e in json.load(f)["traceEvents"] if "dur" in e),
                            key=lambda e: e["ts"])
    names = [e["name"] for e in events if e["name"].startswith("torch_uvm::bring")]
    passes = [e["name"] for e in events if e["name"].startswith(("torch_uvm::bring", "pass "))]
    streamed = [u.name for u in handle.units_in_order() if u not in handle.resident_units()]
    assert len(streamed) >= 6, streamed                    # streamed past the skip
    on_demand = {n.split(" ", 1)[1] for n in names if n.startswith("torch_uvm::bring ")}
    ahead = {n.split(" ", 1)[1] for n in names if n.startswith("torch_uvm::bring_ahead ")}
    seen = (streamed, [u.name for u in handle.resident_units()], passes)
    assert on_demand == {"layers.2"}, seen                # only the one after the skip
    assert set(streamed) - {"layers.2"} <= ahead, seen


class TwoWays(torch.nn.Module):
    """A unit with two weights of its own, one used each step: its
    gradients never all arrive, so its backward never completes."""

    def __init__(self, width=1024):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(width, width) / width ** 0.5)
        self.b = torch.nn.Parameter(torch.randn(width, width) / width ** 0.5)
        self.calls = 0

    def forward(self, x):
        w = self.a if self.calls % 2 == 0 else self.b
        self.calls += 1
        return torch.tanh(x @ w)


def test_units_whose_gradients_never_all_arrive_let_go_when_a_bring_needs_room(uvm):
    """12 such units of 8 MiB under 48 MiB: each stays held after its
    backward, until a bring that must happen finds the budget held and they
    let go (their weights are read where they are, if they leave)."""
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[TwoWays() for _ in range(12)])
    batches = data(4)
    both(uvm, build, lambda m, o: train(m, o, batches), budget=48 * MiB)


def test_gradients_accumulated_over_many_backwards_let_go_when_a_bring_needs_room(uvm):
    """Accumulating over four backwards: from the third, every weight has a
    gradient already, so no room is made for new ones, and units whose
    gradients never all arrive stay held through the backward. A bring that
    must happen finds the budget held and lets them go, rather than fail."""
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[TwoWays() for _ in range(12)])
    batches = data(8)

    def loop(model, optimizer):
        losses = []
        for i, x in enumerate(batches):
            loss = model(x).square().mean() / 4
            loss.backward()
            losses.append(loss.item())
            if i % 4 == 3:
                optimizer.step()
                optimizer.zero_grad()
        return losses
    both(uvm, build, loop, budget=48 * MiB)


class Adapted(torch.nn.Module):
    """A frozen base and a small trainable adapter, as a hand-written LoRA."""

    def __init__(self, width=1024, rank=8):
        super().__init__()
        self.base = torch.nn.Linear(width, width).requires_grad_(False)
        self.down = torch.nn.Linear(width, rank, bias=False)
        self.up = torch.nn.Linear(rank, width, bias=False)

    def forward(self, x):
        return torch.relu(self.base(x) + self.up(self.down(x)))


def adapted(blocks=16):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Adapted() for _ in range(blocks)])


@in_backward
def test_a_frozen_base_trains_in_a_budget_near_its_inference_budget(uvm, in_backward):
    """16 frozen 4 MiB bases with adapters of 32 KiB each: a step brings an
    adapter, so 12 MiB (two bases streaming, and room for an adapter's
    step) trains it, where room for a base's gradients and states would
    take 20."""
    batches = data(3)
    both(uvm, adapted, lambda m, o: train(m, o, batches), budget=12 * MiB,
         in_backward=in_backward)


def test_a_frozen_base_keeps_more_of_itself_resident(uvm):
    """Under 48 MiB, the room a step needs is an adapter's, not a base's:
    about nine bases stay resident (in the driver's words: in device memory
    between steps), where room for a base's step would leave four."""
    batches = data(2)
    handle = both(uvm, adapted, lambda m, o: train(m, o, batches), budget=48 * MiB)
    resident = [u for u in handle.resident_units() if u.name.endswith("base")]
    assert len(resident) >= 8
    assert all(where(u.module.weight) == "gpu" for u in resident)    # by the driver
    assert handle.least_budget() < 9 * MiB


@in_backward
def test_an_adapter_streams_with_its_base_as_one_unit(uvm, in_backward):
    """units=Adapted: each block's frozen base and its adapter are one unit,
    brought whole (16 units where there were 48, two of every three a tiny
    adapter's), and train as all resident does."""
    batches = data(3)
    handle = both(uvm, adapted, lambda m, o: train(m, o, batches), budget=16 * MiB,
                  in_backward=in_backward, units=Adapted)
    assert [u.name for u in handle.units] == [str(i) for i in range(16)]
    block = handle.module[3]
    assert handle.units[3].module is block
    assert handle.units[3].members == [block.base, block.down, block.up]
    assert handle.units[3].trainable == [block.down.weight, block.up.weight]
    # the least budget: two whole blocks streaming, and a block's adapters' step
    assert handle.least_budget() > 2 * block.base.weight.nbytes
    handle.undo()
    # two bases fit 8.1 MiB, two whole blocks do not: sized by the unit
    with pytest.raises(ValueError, match=r"cannot stream submodule '0' .* stream smaller units"):
        uvm.offload(adapted(), budget=int(8.1 * MiB), units=Adapted)


def test_a_base_shared_by_two_adapted_blocks_streams_on_its_own(uvm):
    """units=Adapted where two blocks share one frozen base: neither block's
    hooks see the base's calls from the other, so the base is a unit of its
    own (brought and waited for at each call), and the model trains as all
    resident does."""
    def build():
        model = adapted(8)
        model[5].base = model[2].base
        return model
    batches = data(3)
    handle = both(uvm, build, lambda m, o: train(m, o, batches), budget=16 * MiB, units=Adapted)
    names = [u.name for u in handle.units]
    assert "2.base" in names and "2" in names and "5" in names
    block = handle.module[2]
    assert handle.units[names.index("2")].members == [block.down, block.up]


def test_parameters_unfrozen_between_steps_train_from_then_on(uvm):
    """Progressive unfreezing: the last layer trains first, one more every
    two steps (an optimizer over all of them, made up front while the rest
    was frozen)."""
    def build():
        model = make_model(width=1024)
        for layer in list(model)[:-1]:
            layer.requires_grad_(False)
        return model

    def loop(model, optimizer):
        layers = list(model)
        losses = []
        for i, x in enumerate(data(8)):
            if i and i % 2 == 0:
                layers[-1 - i // 2].requires_grad_(True)
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses
    both(uvm, build, loop, budget=24 * MiB)


def test_a_layer_frozen_with_its_gradient_kept_steps_as_pytorch_steps_it(uvm):
    """zero_grad(set_to_none=False) keeps zeroed gradients; a layer frozen
    then still has one, and PyTorch's step moves it (its momentum). The
    streamed step steps it too, as all resident (tests/python/
    test_lifecycle.py found the difference on the CPU)."""
    def freeze_first(i, model):
        if i == 2:
            model[0].requires_grad_(False)

    def loop(model, optimizer):
        return train(model, optimizer, data(4), before=freeze_first, set_to_none=False)[0]
    both(uvm, lambda: make_model(width=1024), loop, budget=24 * MiB,
         make_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))


class TiedRouted(torch.nn.Module):
    """Three Linears, the first two sharing a weight (streamed by the
    first); `skip` leaves the first out of a forward (an expert not routed
    to), the shared weight's gradient then coming through the second."""

    def __init__(self, width=1024):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(3))
        self.layers[1].weight = self.layers[0].weight
        self.skip = False

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            if not (k == 0 and self.skip):
                x = torch.tanh(layer(x))
        return x


@in_backward
def test_a_tied_weight_whose_owner_did_not_run_trains_as_all_resident(uvm, in_backward):
    """Every other step the weight's owner is not routed to: its gradient
    comes through the other layer alone, goes home, and steps
    (tests/python/test_lifecycle.py found it stayed out of the books)."""
    def route(i, model):
        model.skip = bool(i % 2)

    def loop(model, optimizer):
        return train(model, optimizer, data(4), before=route)[0]
    both(uvm, TiedRouted, loop, budget=24 * MiB, in_backward=in_backward)


def test_a_discriminator_frozen_for_the_generators_step_and_back(uvm):
    """A GAN's loop: two offloads, two streamed optimizers, the
    discriminator frozen while the generator steps."""
    def build():
        torch.manual_seed(0)
        return make_model(layers=4, width=1024), make_model(layers=4, width=1024)

    def loop(g, d, opt_g, opt_d):
        losses = []
        for z in data(4):
            fake = g(z)
            loss_d = d(fake.detach()).mean() - d(z).mean()
            loss_d.backward()
            opt_d.step()
            opt_d.zero_grad()
            d.requires_grad_(False)
            loss_g = -d(g(z)).mean()
            loss_g.backward()
            opt_g.step()
            opt_g.zero_grad()
            d.requires_grad_(True)
            losses += [loss_d.item(), loss_g.item()]
        return losses
    g, d = (m.cuda() for m in build())
    want = loop(g, d, torch.optim.AdamW(g.parameters()), torch.optim.AdamW(d.parameters()))
    g2, d2 = build()
    hg, hd = uvm.offload(g2, budget=24 * MiB), uvm.offload(d2, budget=24 * MiB)
    opt_g, opt_d = hg.stream_optimizer(torch.optim.AdamW(g2.parameters())), \
        hd.stream_optimizer(torch.optim.AdamW(d2.parameters()))
    got = loop(g2, d2, opt_g, opt_d)
    assert got == want
    for p, q in zip(list(g2.parameters()) + list(d2.parameters()),
                    list(g.parameters()) + list(d.parameters())):
        assert torch.equal(p, q)


class _SleepInBackward(torch.autograd.Function):
    """Identity; its backward puts the GPU to sleep first, so the host runs
    ahead of whatever the backward queues after it."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(200_000_000)
        return grad


@in_backward
def test_a_module_called_twice_makes_room_for_its_gradients_after_its_last_backward(
        uvm, in_backward):
    """A model called twice in one forward (a GAN's discriminator on real and
    on generated samples): autograd runs each submodule's backward twice,
    and its gradients come after the second. Autograd runs the second call's
    graph first; the first call's begins with the GPU asleep, so the host
    queues its gradients' copies home far ahead of them. Room for each
    submodule's gradients is made at its last backward, waiting for copies
    home as the budget needs: the books, copies home included, stay within
    the budget (the GAN example went to twice its budget, on an H200 shared
    with other tests)."""
    def loop(model, optimizer):
        losses = []
        for x in data(3):
            loss = (_SleepInBackward.apply(model(x)).square().mean()
                    + model(x * 0.5).square().mean())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses
    both(uvm, lambda: make_model(width=1024), loop, budget=24 * MiB, in_backward=in_backward)


@in_backward
def test_step_runs_the_closure_and_returns_its_loss(uvm, in_backward):
    """Lightning's automatic optimization: optimizer.step(closure)."""
    def loop(model, optimizer):
        losses = []
        for x in data(3):
            def closure():
                optimizer.zero_grad()
                loss = model(x).square().mean()
                loss.backward()
                return loss
            losses.append(optimizer.step(closure).item())
        return losses
    both(uvm, lambda: make_model(width=1024), loop, budget=24 * MiB, in_backward=in_backward)


def test_a_closure_that_raises_steps_nothing_and_says_so(uvm):
    model = make_model(width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()))
    before = [p.detach().cpu() for p in model.parameters()]

    def closure():
        model(data(1)[0]).square().mean().backward()
        raise KeyError("the user's")
    with pytest.raises((KeyError, RuntimeError)) as e:
        optimizer.step(closure)
    assert "closure raised" in "".join(getattr(e.value, "__notes__", [])) + str(e.value)
    assert all(torch.equal(p.detach().cpu(), q) for p, q in zip(model.parameters(), before))
    optimizer.zero_grad()
    train(model, optimizer, data(1))           # and training goes on


def test_loaded_optimizer_states_go_to_their_homes(uvm):
    """A streamed optimizer's checkpoint holds its states as CPU tensors over
    their homes, so loading it without map_location (as Lightning does)
    never lands them on the GPU; loaded into a streamed optimizer, they go
    to pinned homes (load_state_dict would cast them all to the GPU at
    once), and training resumes where it stopped, as all resident."""
    batches = data(4)

    def loop(model, optimizer):
        first, _ = train(model, optimizer, batches[:2])
        saved = io.BytesIO()
        state_dict = optimizer.state_dict()
        if hasattr(model, "_torch_uvm_offloaded"):
            # (state_dict's parameters are numbered in param_groups' order)
            live = [optimizer.state[p] for g in optimizer.param_groups for p in g["params"]]
            pairs = [(t, live[i][key]) for i, st in state_dict["state"].items()
                     for key, t in st.items()
                     if isinstance(t, torch.Tensor) and t.nbytes >= 64 << 10]
            assert len(pairs) == 16
            assert all(saved.device.type == "cpu" and now.is_cuda for saved, now in pairs)
            # those at home (in the driver's words: host memory) are their
            # homes' memory, not copies
            at_home = [(saved, now) for saved, now in pairs if memory_type(now) == "host"]
            assert len(at_home) >= 8
            assert all(saved.data_ptr() == now.data_ptr() for saved, now in at_home)
            assert all(torch.equal(saved, now.cpu()) for saved, now in pairs)
        torch.save(state_dict, saved)
        saved.seek(0)
        fresh = type(optimizer)(model.parameters(), lr=1e-3)
        if hasattr(model, "_torch_uvm_offloaded"):
            fresh = model._torch_uvm_offloaded.stream_optimizer(fresh)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            allocated = torch.cuda.memory_allocated()
        fresh.load_state_dict(torch.load(saved))
        if hasattr(model, "_torch_uvm_offloaded"):
            states = [t for st in fresh.state.values() for t in st.values()
                      if isinstance(t, torch.Tensor) and t.nbytes >= 64 << 10]
            assert len(states) == 16 and all(memory_type(t) == "host" for t in states)
            # loaded and not yet stepped, a state is not yet the executor's:
            # a checkpoint copies it (an alias would lose its memory when
            # the executor takes the home over)
            early = [t for st in fresh.state_dict()["state"].values() for t in st.values()
                     if isinstance(t, torch.Tensor) and t.nbytes >= 64 << 10]
            assert len(early) == 16 and all(t.device.type == "cpu" for t in early)
            assert not {t.data_ptr() for t in early} & {t.data_ptr() for t in states}
            # no state passed through the GPU: at most one layer's at a time
            assert torch.cuda.max_memory_allocated() - allocated <= 8 * MiB
        second, _ = train(model, fresh, batches[2:])
        return first + second
    both(uvm, lambda: make_model(width=1024), loop, budget=24 * MiB)


def test_parameters_that_are_not_offloaded_step_as_they_are(uvm):
    """An optimizer over the whole model where only its body is offloaded
    (the head stays on the GPU as it is)."""
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(make_model(layers=6, width=1024), torch.nn.Linear(1024, 16))
    batches = data(3)
    reference = build().cuda()
    want = train(reference, torch.optim.AdamW(reference.parameters()), batches)
    model = build()
    model[1].cuda()
    handle = uvm.offload(model[0], budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()))
    assert train(model, optimizer, batches) == want
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def test_a_new_input_shape_each_step(uvm):
    def loop(model, optimizer):
        g = torch.Generator(device="cuda").manual_seed(3)
        return train(model, optimizer, [torch.randn(rows, 1024, device="cuda", generator=g)
                                        for rows in (64, 7, 256, 1, 128)])
    both(uvm, lambda: make_model(width=1024), loop, budget=24 * MiB)


def test_mode_reads_auto_until_the_first_forward_chooses(uvm):
    model = make_model(width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    seen = []
    model[3].register_forward_pre_hook(lambda *_: seen.append(handle.mode))
    assert handle.mode == "auto"
    with torch.no_grad():
        model(torch.randn(4, 1024, device="cuda"))
    assert seen == ["auto"] and handle.mode in ("in_place", "prefetch")


def test_bad_optimizers_are_refused_before_anything_changes(uvm):
    torch.manual_seed(0)
    g, d = make_model(layers=2, width=1024), make_model(layers=2, width=1024)
    originals = list(g.parameters())
    hg = uvm.offload(g, budget=24 * MiB)
    uvm.offload(d, budget=24 * MiB)
    for optimizer, error in [
            (torch.optim.AdamW(list(g.parameters()) + list(d.parameters())), "another offloaded"),
            (torch.optim.AdamW(originals), "create the optimizer after"),
            (torch.optim.LBFGS(g.parameters()), "LBFGS cannot be streamed")]:
        with pytest.raises(ValueError, match=error):
            hg.stream_optimizer(optimizer)
        assert "step" not in optimizer.__dict__          # nothing changed
    optimizer = hg.stream_optimizer(torch.optim.AdamW(g.parameters()))
    with pytest.raises(ValueError, match="streamed by this offload already"):
        hg.stream_optimizer(optimizer)
    # another offload's parameters added after streaming: refused at the step
    optimizer.add_param_group({"params": list(d.parameters())})
    g(torch.randn(4, 1024, device="cuda")).sum().backward()
    before = [p.detach().cpu() for p in g.parameters()]
    with pytest.raises(ValueError, match="another offloaded"):
        optimizer.step()
    assert all(torch.equal(p.detach().cpu(), q) for p, q in zip(g.parameters(), before))


def test_a_budget_below_the_smallest_step_is_refused_naming_it(uvm):
    model = make_model(width=1024)                        # 4 MiB layers: 5 x 4 to train
    handle = uvm.offload(model, budget=16 * MiB)
    with pytest.raises(ValueError, match=r"at least 20\d{6} bytes \(20 MiB\)"):
        handle.stream_optimizer(torch.optim.AdamW(model.parameters()))
    assert handle.least_budget() == 20 * MiB + 5 * 4096    # its biases too
    handle.undo()
    handle = uvm.offload(model, budget=handle.least_budget())
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()))
    train(model, optimizer, data(2))


def test_an_arena_holds_many_small_tensors_at_its_rounding(uvm):
    """4100 tensors of 260 bytes: 1.0 MiB of weights, but 2.0 MiB as the
    arena's 512-byte blocks: an arena sized by the weights' bytes would draw
    the last ones beside it."""
    class Many(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(65))
                                             for _ in range(4100))

        def forward(self, x):
            return x + sum(p.sum() for p in self.ps)
    model = Many()
    uvm.reset_peak_memory_stats()
    before = uvm.memory_stats().get("slots.cuda:0.arena_misses", 0)
    handle = uvm.offload(model, budget=64 * MiB, mode="prefetch")
    with torch.no_grad():
        model(torch.zeros(1, device="cuda"))
        model(torch.zeros(1, device="cuda"))
    torch.cuda.synchronize()
    assert len(handle.resident_units()) == len(handle.units)
    assert uvm.memory_stats()["slots.cuda:0.arena_misses"] == before


def test_moving_an_offloaded_module_to_the_cpu_undoes_the_offload(uvm):
    """Lightning's teardown moves the module to the CPU: the offload is
    undone first (its values kept); conversions it cannot do in place are
    refused by name; moves that change nothing pass."""
    model = make_model(width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()))
    train(model, optimizer, data(2))
    want = [p.detach().cpu() for p in model.parameters()]
    model.cuda()
    model.to("cuda")
    assert model._torch_uvm_offloaded is handle
    with pytest.raises(RuntimeError, match="undo\\(\\) the offload, convert"):
        model.half()
    model.cpu()
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    assert all(p.device.type == "cpu" and torch.equal(p, q) for p, q in zip(model.parameters(), want))
    assert handle.residency_stats()["resident_bytes.peak"] <= 24 * MiB   # as when undone
    handle.undo()                                         # once is enough


def test_freezing_and_unfreezing_every_step_reuses_each_gradients_home(uvm):
    """A GAN freezes its discriminator for every generator step: each
    parameter's gradient keeps its one streamed tensor (and pinned home)
    across the toggles, instead of a new one each time."""
    model = make_model(layers=4, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()))
    counts = []
    for i, x in enumerate(data(8)):
        model.requires_grad_(i % 2 == 0)
        loss = model(x).square().mean() if i % 2 == 0 else (model(x).detach() * 0).sum()
        if i % 2 == 0:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        counts.append(handle.executor.streamed_tensors())
    assert counts[2:] == [counts[2]] * (len(counts) - 2)


def test_a_backward_that_raises_half_way_is_ended_before_the_next_forward(uvm):
    """Autograd runs no queued callback when a backward raises: the next
    forward ends it (the steps in backward waited for, nothing held), and
    training goes on."""
    model = make_model(width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters()),
                                        step_in_backward=True)
    train(model, optimizer, data(1))
    out = model(data(1)[0])
    out.register_hook(lambda g: (_ for _ in ()).throw(KeyError("a hook that fails")))
    with pytest.raises(KeyError):
        (out * 2).square().mean().backward()
    assert handle.state.lifecycle.backward_active()                        # autograd left it so
    with torch.no_grad():
        model(data(1)[0])
    assert not handle.state.lifecycle.backward_active()
    optimizer.zero_grad()
    train(model, optimizer, data(2))
    assert handle.executor.holders().startswith("no streamed unit")


def test_a_forward_with_grad_and_no_optimizer_keeps_an_inference_plan(uvm):
    """Inference without no_grad (no optimizer streamed): the plan made for
    inference stays, even under a budget too small to train."""
    model = make_model(width=1024)
    handle = uvm.offload(model, budget=12 * MiB)          # training would need 20
    x = torch.randn(4, 1024, device="cuda")
    with torch.no_grad():
        want = model(x)
    got = model(x)
    assert torch.equal(got, want) and not handle.training


def test_a_memory_format_change_of_an_offloaded_module_is_refused(uvm):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3), torch.nn.Conv2d(64, 64, 3))
    handle = uvm.offload(model, budget=64 * MiB)
    with pytest.raises(RuntimeError, match="another memory format"):
        model.to(memory_format=torch.channels_last)
    assert model._torch_uvm_offloaded is handle


@in_backward
def test_activation_checkpointing_gives_the_all_resident_losses(uvm, in_backward):
    """Blocks recomputed in backward (non-reentrant checkpointing): the
    recomputed forwards bring nothing ahead, and nothing stays held."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = make_model(width=1024)

        def forward(self, x):
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False)
            return x
    batches = data(3)
    handle = both(uvm, Checkpointed, lambda m, o: train(m, o, batches), budget=24 * MiB,
                  in_backward=in_backward)
    assert handle.executor.holders().startswith("no streamed unit")


def test_gradients_that_came_in_part_go_home_at_the_end_of_backward(uvm):
    """A unit whose forward used one of its two weights gets one gradient of
    two: at the end of backward that one goes home (in the driver's words:
    host memory) like any complete unit's, rather than wait on the GPU for
    a gradient that never comes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[TwoWays() for _ in range(12)])
    handle = uvm.offload(model, budget=48 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    for x in data(2):
        model(x).square().mean().backward()
        torch.cuda.synchronize()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert len(grads) == 12
        assert [where(g) for g in grads] == ["host"] * 12
        optimizer.step()
        optimizer.zero_grad()


def test_unfreezing_past_what_the_budget_can_step_is_refused_at_the_next_forward(uvm):
    """Frozen bases train under 12 MiB; unfrozen, a step of a base's
    weights, gradients and states needs more: the next forward that builds a
    graph refuses before it runs, naming the least budget, and nothing
    changed (frozen again, training goes on)."""
    model = adapted()
    handle = uvm.offload(model, budget=12 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    batches = data(3)
    train(model, optimizer, batches[:1])
    ran = []
    hook = model[0].register_forward_pre_hook(lambda *_: ran.append(1))
    for block in model:
        block.base.requires_grad_(True)
    before = [p.detach().cpu() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"cannot train this module.*at least \d+ bytes"):
        model(batches[1])
    assert ran == [] and all(torch.equal(p.detach().cpu(), q)
                             for p, q in zip(model.parameters(), before))
    with torch.no_grad():                       # inference needs no step's room
        model(batches[1])
    hook.remove()
    for block in model:
        block.base.requires_grad_(False)
    train(model, optimizer, batches[1:])


def test_a_step_in_backward_under_torch_distributed_warns_that_replicas_drift(uvm, tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = make_model(width=1024)
        handle = uvm.offload(model, budget=24 * MiB)
        with pytest.warns(UserWarning, match="drift apart"):
            handle.stream_optimizer(torch.optim.AdamW(model.parameters()), step_in_backward=True)
    finally:
        dist.destroy_process_group()


def test_a_gradient_that_shares_its_memory_is_refused_naming_the_submodule(uvm):
    """Gradients set by hand as views of one flat buffer (as DDP's
    gradient_as_bucket_view does): backward refuses, naming the submodule;
    set to None, training goes on as all resident."""
    model = make_model(layers=4, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), device="cuda")
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    x, = data(1)
    with pytest.raises(RuntimeError, match=r"the gradient of '\d' shares its memory"):
        model(x).square().mean().backward()
    optimizer.zero_grad(set_to_none=True)
    train(model, optimizer, data(2))
    assert handle.executor.holders().startswith("no streamed unit")


def test_the_process_gpu_memory_of_offloaded_training_is_twice_its_budget_at_most(uvm):
    """Measured by the device (mem_get_info, sampled at each submodule's
    forward and backward and at each step), apart from torch_uvm's books:
    training 256 MiB of weights (1.25 GiB with gradients and AdamW's states)
    under 96 MiB takes at most twice the budget (the slots' range, and the
    gradients and first states PyTorch makes beside it, counted in the same
    books) beside what the same loop takes all resident beyond its
    weights, gradients and states (activations: a fused AdamW makes no
    temporaries of the parameters' size), plus 48 MiB. Measured on an H100
    (2026-11-25): 226 MiB, 2 x 96 + 34, where all resident held nothing
    beside the model it did not hold offloaded."""
    def build():
        return make_model(layers=16)                      # 16 x 16 MiB
    x = data(1, width=2048)[0]

    def measure(model, optimizer):
        torch.cuda.synchronize()
        uvm.empty_cache()
        uvm._C.release_cached_slots()
        least = [torch.cuda.mem_get_info()[0]]

        def note(*_):
            least[0] = min(least[0], torch.cuda.mem_get_info()[0])
        hooks = [m.register_forward_pre_hook(note) for m in model]
        hooks += [m.register_full_backward_pre_hook(note) for m in model]
        hooks.append(optimizer.register_step_pre_hook(note))
        hooks.append(optimizer.register_step_post_hook(note))
        free = least[0]
        for _ in range(3):
            model(x).square().mean().backward()
            note()
            optimizer.step()
            optimizer.zero_grad()
            note()
        for h in hooks:
            h.remove()
        return free - least[0]

    reference = build().cuda()
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, fused=True)
    # weights, gradients and two states, all resident (the first run's
    # measure starts with the weights on the GPU already)
    resident_used = measure(reference, opt) + sum(p.nbytes for p in reference.parameters())
    beside = max(resident_used - 4 * sum(p.nbytes for p in reference.parameters()), 0)
    del reference, opt
    model = build()
    budget = 96 * MiB
    handle = uvm.offload(model, budget=budget)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3,
                                                          fused=True))
    used = measure(model, optimizer)
    print(f"offloaded: {used / MiB:.1f} MiB of the GPU under a {budget // MiB} MiB budget; "
          f"all resident {resident_used / MiB:.1f} MiB, {beside / MiB:.1f} beside the model")
    assert used <= 2 * budget + beside + 48 * MiB
    assert handle.residency_stats()["resident_bytes.peak"] <= budget


def test_clipping_after_the_default_step_gives_the_all_resident_weights(uvm):
    """clip_grad_norm_ between backward and step (the Hugging Face Trainer's
    default, max_grad_norm=1.0) clips the offloaded gradients as all
    resident, and returns the same norm."""
    batches = data(3)
    norms = {}

    def loop(model, optimizer):
        seen = []
        for x in batches:
            (model(x).square().mean() * 1e3).backward()
            seen.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            optimizer.step()
            optimizer.zero_grad()
        norms[len(norms)] = seen
        return seen
    both(uvm, lambda: make_model(width=1024), loop, budget=24 * MiB)
    assert all(n > 1.0 for n in norms[0])            # it did clip


@in_backward
def test_training_goes_on_after_undo_with_the_same_optimizer(uvm, in_backward):
    """undo() hands the streamed optimizer the module's parameters back, with
    their states on the GPU the module came from: training on with it after
    undo gives all resident's weights and states bit for bit (it stepped the
    offload's parameters, no module's, the module's weights unchanged)."""
    batches = data(4)
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)
    reference = make_model(width=1024).cuda()
    ref_opt = make(reference)
    want = train(reference, ref_opt, batches)[0]
    model = make_model(width=1024).cuda()
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(make(model), step_in_backward=in_backward)
    got = train(model, optimizer, batches[:2])[0]
    handle.undo()
    got += train(model, optimizer, batches[2:])[0]
    torch.cuda.synchronize()
    assert got == want
    params = list(model.parameters())
    assert all(a is b for a, b in zip(
        [p for g in optimizer.param_groups for p in g["params"]], params))
    for p, q in zip(params, reference.parameters()):
        assert torch.equal(p, q)
        mine, theirs = optimizer.state[p], ref_opt.state[q]
        assert mine.keys() == theirs.keys()
        for key in theirs:
            assert torch.equal(mine[key].cpu(), theirs[key].cpu()), key
            if key != "step":
                assert where(mine[key]) == "gpu", key   # the driver's word, not pinned homes


def test_training_goes_on_on_the_cpu_after_undo_of_a_cpu_model(uvm):
    """A model offloaded from the CPU goes back there on undo(), and so does
    every state of its streamed optimizer, the small ones (a bias's moments,
    plain CUDA tensors, not homes) too: training goes on on the CPU as the
    all-resident model moved to the CPU after the same steps."""
    batches = data(4)
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)
    reference = make_model(layers=4, width=1024).cuda()
    ref_opt = make(reference)
    train(reference, ref_opt, batches[:2])
    reference.cpu()
    for st in ref_opt.state.values():
        for key, v in list(st.items()):
            if isinstance(v, torch.Tensor):
                st[key] = v.cpu()
    on_cpu = [b.cpu() for b in batches[2:]]
    want = train(reference, ref_opt, on_cpu)[0]
    model = make_model(layers=4, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(make(model))
    train(model, optimizer, batches[:2])
    handle.undo()
    assert all(not t.is_cuda for st in optimizer.state.values() for t in st.values()
               if isinstance(t, torch.Tensor))
    assert train(model, optimizer, on_cpu)[0] == want
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("clip", ["clip_grad_norm_", "clip_grad_value_"])
def test_clipping_gradients_that_stepped_in_backward_is_refused(uvm, clip):
    """With step_in_backward the gradients stepped and are gone by the time
    a clip runs: PyTorch's clip over them raises, naming step_in_backward
    and the way out, instead of clipping nothing. Parameters of no such
    offload clip as usual meanwhile, and step() after the refusal ends the
    step as usual."""
    model = make_model(layers=4, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                        step_in_backward=True)
    other = torch.nn.Linear(8, 8).cuda()
    other(torch.randn(2, 8, device="cuda")).sum().backward()
    model(data(1)[0]).square().mean().backward()
    args = (1.0,)
    with pytest.raises(RuntimeError, match=r"step_in_backward.*max_grad_norm=0"):
        getattr(torch.nn.utils, clip)(model.parameters(), *args)
    with pytest.raises(RuntimeError, match="step_in_backward"):
        getattr(torch.nn.utils, clip)(list(model.parameters()) + list(other.parameters()), *args)
    getattr(torch.nn.utils, clip)(other.parameters(), *args)
    optimizer.step()
    optimizer.zero_grad()
    assert torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) == 0   # none stepped since
