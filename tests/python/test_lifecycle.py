"""The offload's lifecycle without a GPU (tests/python/lifecycle.py): drawn
training loops run on a CPU model whose hooks are an offload's, over a fake
executor, and on a plain copy of it. Losses, weights and optimizer states
must be equal bit for bit (the streamed step steps one unit at a time), and
the executor's books must say that every unit with gradients sent them home
once per backward and stepped once per step."""
import random

import pytest
import torch

from lifecycle import CallError, cpu_streams, offload_on_cpu
from torch_uvm.offload_state import STEPS_BEHIND


class Partial(torch.nn.Linear):
    """A Linear whose forward leaves its bias out: a unit whose gradients
    come in part (an unused branch)."""

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


class Net(torch.nn.Module):
    """Linear layers with tanh between them; `twice` runs one layer a
    second time (a module called twice in one forward, as a GAN's
    discriminator is); layer `partial` is a Partial."""

    def __init__(self, layers, width, twice, bias, partial=-1):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            (Partial if k == partial else torch.nn.Linear)(width, width, bias=bias)
            for k in range(layers))
        self.twice = twice
        self.skip = -1       # a layer this forward does not run (an expert not routed to)

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            if k == self.skip:
                continue
            x = torch.tanh(layer(x))
            if k == self.twice:
                x = torch.tanh(layer(x))
        return x


def program(seed):
    """A loop drawn from `seed`: the model's shape, what is frozen when, the
    optimizer, accumulation, evaluations, closures, step_in_backward, a
    layer run twice, one whose gradients come in part, one not routed to
    in every other forward, a weight two layers share."""
    r = random.Random(seed)
    layers = r.randint(2, 5)
    p = {
        "layers": layers, "width": r.choice([8, 16]), "bias": r.random() < 0.7,
        "twice": r.choice([-1, -1, r.randrange(layers)]),
        "optimizer": r.choice(["sgd", "sgd_momentum", "adamw", "adam"]),
        "in_backward": r.random() < 0.4,
        "partial": r.choice([-1, -1, r.randrange(layers)]),
        "routed": r.choice([-1, -1, r.randrange(layers)]),   # skipped in every other forward
        "tied": r.choice([-1, -1, r.randrange(layers - 1)]),   # its weight is the next one's too
        "frozen": {r.randrange(layers - 1)} if r.random() < 0.4 else set(),   # (the last trains)
        "steps": [],
    }
    for _ in range(r.randint(2, 4)):
        p["steps"].append({
            "accumulate": 1 if p["in_backward"] else r.choice([1, 1, 2]),
            "evaluate": r.random() < 0.3,
            "closure": r.random() < 0.25,
            # (with step_in_backward the gradients are None after backward, as
            # PyTorch's optimizer in backward leaves them: zeroed ones never stay)
            "set_to_none": p["in_backward"] or r.random() < 0.7,
            "toggle": r.randrange(layers - 1) if r.random() < 0.3 else None,
        })
    return p


def make_optimizer(kind, params):
    return {"sgd": lambda: torch.optim.SGD(params, lr=0.1),
            "sgd_momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
            "adamw": lambda: torch.optim.AdamW(params, lr=0.01),
            "adam": lambda: torch.optim.Adam(params, lr=0.01)}[kind]()


def build(p):
    torch.manual_seed(0)
    model = Net(p["layers"], p["width"], p["twice"], p["bias"], p.get("partial", -1))
    if p.get("tied", -1) >= 0:        # a weight shared by two layers (tied embeddings' kind)
        model.layers[p["tied"] + 1].weight = model.layers[p["tied"]].weight
    for k in p["frozen"]:
        model.layers[k].requires_grad_(False)
    return model


def run(p, model, optimizer, executor=None):
    """The loop; with the fake executor, its books checked after each
    backward and step. Returns the losses and what evaluations gave."""
    torch.manual_seed(1)
    batches = [torch.randn(4, p["width"]) for _ in range(8)]
    losses, seen = [], []
    reached = watch_gradients(model) if executor is not None else set()
    k = 0
    for step in p["steps"]:
        if step["toggle"] is not None:
            layer = model.layers[step["toggle"]]
            layer.requires_grad_(not layer.weight.requires_grad)
        if step["evaluate"]:
            with torch.no_grad():
                seen.append(model(batches[-1]))

        def closure(x=batches[k], k=k):
            model.skip = p.get("routed", -1) if k % 2 else -1
            loss = model(x).square().mean()
            loss.backward()
            return loss
        if step["closure"]:
            losses.append(optimizer.step(closure).detach())
            k += 1
        else:
            for _ in range(step["accumulate"]):
                model.skip = p.get("routed", -1) if k % 2 else -1
                loss = model(batches[k]).square().mean()
                reached.clear()
                loss.backward()
                losses.append(loss.detach())
                k += 1
                if executor is not None:
                    check_backward(p, model, executor, reached)
            with_grads = units_with_grads(executor)
            optimizer.step()
        if executor is not None and not step["closure"]:
            assert set(executor.steps[-1]) == with_grads, "the step brought other units"
        optimizer.zero_grad(set_to_none=step["set_to_none"])
    return losses, seen


def check_backward(p, model, executor, reached):
    """Every unit with a parameter this backward gave a gradient (`reached`:
    their ids) sent its gradients home once, those that came in part too,
    and a unit whose tied weight another unit used."""
    assert executor.backwards, "no backward reached the executor"
    assert not executor.in_backward, "the backward's pass was not closed at its end"
    want = {i for i, u in enumerate(executor.units) if any(id(q) in reached for q in u.params)}
    assert set(executor.backwards[-1]) == want


def watch_gradients(model):
    """The ids of the parameters each backward gives a gradient: cleared by
    the caller before it."""
    reached = set()
    for q in model.parameters():
        was = q.requires_grad                # (a frozen one may be unfrozen later)
        q.requires_grad_(True)
        q.register_post_accumulate_grad_hook(lambda q: reached.add(id(q)))
        q.requires_grad_(was)
    return reached


def units_with_grads(executor):
    """The units a step must bring, each once: those with a parameter that
    has a gradient (not stepped in backward; one frozen since it kept its
    gradient too, as PyTorch's step steps it)."""
    if executor is None:
        return None
    return {i for i, u in enumerate(executor.units) if any(q.grad is not None for q in u.params)}


def states(optimizer, model):
    return [(k, v.clone() if isinstance(v, torch.Tensor) else v)
            for q in model.parameters() for k, v in sorted(optimizer.state.get(q, {}).items())]


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("seed", range(40))
def test_a_drawn_loop_steps_as_the_plain_model_and_keeps_the_books(seed):
    p = program(seed)
    reference = build(p)
    ref_opt = make_optimizer(p["optimizer"], reference.parameters())
    want = run(p, reference, ref_opt)

    model = build(p)
    with cpu_streams():
        handle, executor = offload_on_cpu(model)
        optimizer = handle.stream_optimizer(make_optimizer(p["optimizer"], model.parameters()),
                                            step_in_backward=p["in_backward"])
        got = run(p, model, optimizer, executor)
    assert same(got, want), f"losses or evaluations differ: {p}"
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b), f"weights differ: {p}"
    assert same(states(optimizer, model), states(ref_opt, reference)), f"states differ: {p}"
    assert not any(executor.running.values())
    # a backward stepping went on beside at most STEPS_BEHIND steps under way
    assert executor.most_behind <= STEPS_BEHIND + 1, p


def test_a_second_backward_before_the_step_in_backward_is_refused():
    """With step_in_backward each unit stepped already: a second backward
    before step() raises (no accumulation), naming the way out."""
    p = program(0) | {"frozen": set(), "twice": -1}
    model = build(p)
    with cpu_streams():
        handle, executor = offload_on_cpu(model)
        handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                step_in_backward=True)
        x = torch.randn(4, p["width"])
        model(x).sum().backward()
        with pytest.raises(RuntimeError, match="a second backward before optimizer.step"):
            model(x).sum().backward()


def test_the_fake_executor_refuses_a_gradient_sent_home_twice():
    """The books can fail: a unit's gradients sent home twice in one
    backward raise."""
    model = build(program(1) | {"frozen": set(), "twice": -1})
    with cpu_streams():
        _, executor = offload_on_cpu(model)
        executor.before(0, True)
        executor.grads_ready(0)
        with pytest.raises(CallError, match="went home twice"):
            executor.grads_ready(0)


class Boom(Net):
    """A Net whose backward raises at the output of its first layer while
    `armed` (a backward that fails half-way: out of memory, Ctrl-C)."""
    armed = False

    def forward(self, x):
        x = torch.tanh(self.layers[0](x))
        if self.armed:
            x.register_hook(lambda g: (_ for _ in ()).throw(RuntimeError("boom")))
        for layer in self.layers[1:]:
            x = torch.tanh(layer(x))
        return x


def test_a_backward_that_raises_half_way_is_ended_and_training_goes_on():
    """A backward that raised never reached its end (autograd runs no queued
    callback then): the next forward ends it, the gradients that came go
    home, nothing stays open, and the loop trains on as the plain model."""
    def loop(model, optimizer, executor=None):
        torch.manual_seed(1)
        for i in range(4):
            model.armed = i == 1
            loss = model(torch.randn(4, 8)).square().mean()
            try:
                loss.backward()
            except RuntimeError as e:
                assert "boom" in str(e)
                optimizer.zero_grad()
                continue
            if executor is not None:
                assert not executor.in_backward, "the backward's pass was not closed at its end"
            optimizer.step()
            optimizer.zero_grad()
        model.armed = False
        with torch.no_grad():                # a forward after the last step ends nothing new
            model(torch.randn(4, 8))

    torch.manual_seed(0)
    reference = Boom(3, 8, -1, True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    loop(reference, ref_opt)
    torch.manual_seed(0)
    model = Boom(3, 8, -1, True)
    with cpu_streams():
        handle, executor = offload_on_cpu(model)
        optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
        loop(model, optimizer, executor)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    assert len(executor.backwards) == 4      # the failed one was ended too
    assert executor.backwards[1] == {1: 1, 2: 1}   # the layers its gradients reached
    assert not handle.state.lifecycle.backward_active() and not any(executor.running.values())


@pytest.mark.parametrize("in_backward", [False, True], ids=["step_after", "step_in_backward"])
def test_a_tied_weight_whose_owner_did_not_run_sends_its_gradient_home(in_backward):
    """Layers 0 and 1 share a weight, its gradient streamed by layer 0; in
    every other forward layer 0 is not routed to, and the weight's gradient
    comes through layer 1 alone. It goes home then too (before, layer 0's
    count ran past what it expects and never reached it: the gradient stayed
    on the GPU outside the budget)."""
    p = program(3) | {"layers": 3, "tied": 0, "routed": 0, "twice": -1, "partial": -1,
                      "frozen": set(), "in_backward": in_backward, "optimizer": "adamw",
                      "bias": True}
    p["steps"] = [{"accumulate": 1, "evaluate": False, "closure": False, "set_to_none": True,
                   "toggle": None} for _ in range(4)]
    reference = build(p)
    want = run(p, reference, make_optimizer(p["optimizer"], reference.parameters()))
    model = build(p)
    with cpu_streams():
        handle, executor = offload_on_cpu(model)
        optimizer = handle.stream_optimizer(make_optimizer(p["optimizer"], model.parameters()),
                                            step_in_backward=in_backward)
        got = run(p, model, optimizer, executor)
    assert same(got, want)
    assert [sorted(b) for b in executor.backwards] == [[0, 1, 2]] * 4


@pytest.mark.parametrize("in_backward", [False, True], ids=["step_after", "step_in_backward"])
def test_a_gan_of_two_offloads_trains_as_the_plain_pair(in_backward):
    """Two offloads, two streamed optimizers: the discriminator runs on real
    and generated samples (called twice in one forward) and steps; then it is
    frozen while the generator steps through it, and unfrozen after."""
    def pair():
        torch.manual_seed(0)
        return Net(3, 8, -1, True), Net(2, 8, -1, True)

    def loop(g, d, g_opt, d_opt):
        torch.manual_seed(1)
        losses = []
        for _ in range(3):
            z, real = torch.randn(4, 8), torch.randn(4, 8)
            fake = g(z)
            d_loss = d(real).mean() - d(fake.detach()).mean()
            d_loss.backward()
            d_opt.step()
            d_opt.zero_grad()
            d.requires_grad_(False)
            g_loss = -d(g(z)).mean()
            g_loss.backward()
            g_opt.step()
            g_opt.zero_grad()
            d.requires_grad_(True)
            losses += [d_loss.detach(), g_loss.detach()]
        return losses

    g, d = pair()
    want = loop(g, d, torch.optim.Adam(g.parameters(), lr=0.01),
                torch.optim.Adam(d.parameters(), lr=0.01))
    want_weights = [t.detach().clone() for t in list(g.parameters()) + list(d.parameters())]
    g, d = pair()
    with cpu_streams():
        g_handle, g_exec = offload_on_cpu(g)
        d_handle, d_exec = offload_on_cpu(d)
        g_opt = g_handle.stream_optimizer(torch.optim.Adam(g.parameters(), lr=0.01),
                                          step_in_backward=in_backward)
        d_opt = d_handle.stream_optimizer(torch.optim.Adam(d.parameters(), lr=0.01),
                                          step_in_backward=in_backward)
        got = loop(g, d, g_opt, d_opt)
    assert same(got, want)
    assert all(torch.equal(a, b) for a, b in
               zip(list(g.parameters()) + list(d.parameters()), want_weights))
    # the discriminator's gradients went home in its own backwards only
    assert all(sorted(b) == [0, 1] for b in d_exec.backwards if b)
    assert not any(g_exec.running.values()) and not any(d_exec.running.values())


def test_a_gradient_that_comes_before_any_units_backward_goes_home():
    """A regularizer over a layer's weight gives it a gradient as soon as
    backward starts, before any unit's backward began; in every other step
    the layer is not routed to, so that is all it gets: it goes home then,
    in part (not its bias), and the loop trains as the plain model."""
    def loop(model, optimizer, executor=None):
        torch.manual_seed(1)
        for k in range(4):
            model.skip = 0 if k % 2 else -1
            loss = model(torch.randn(4, 8)).square().mean() + \
                0.1 * model.layers[0].weight.square().sum()
            loss.backward()
            if executor is not None:
                assert 0 in executor.backwards[-1], f"step {k}: layer 0's gradient stayed out"
            optimizer.step()
            optimizer.zero_grad()

    torch.manual_seed(0)
    reference = Net(3, 8, -1, True)
    loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9))
    torch.manual_seed(0)
    model = Net(3, 8, -1, True)
    with cpu_streams():
        handle, executor = offload_on_cpu(model)
        loop(model, handle.stream_optimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)), executor)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))


def test_reentrant_checkpointing_over_a_shared_layer_with_step_in_backward_is_refused():
    """Reentrant checkpointing runs each segment's backward as a backward of
    its own: a layer in two segments gets its gradients twice. With
    step_in_backward it would step on each part alone (a wrong result): the
    second part raises, naming use_reentrant=False."""
    from torch.utils.checkpoint import checkpoint

    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shared, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            x = checkpoint(lambda t: torch.tanh(self.shared(t)), x, use_reentrant=True)
            x = checkpoint(lambda t: torch.tanh(self.shared(t)), x, use_reentrant=True)
            return self.head(x)

    torch.manual_seed(0)
    model = Shared()
    with cpu_streams():
        handle, _ = offload_on_cpu(model)
        handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                step_in_backward=True)
        x = torch.randn(4, 8, requires_grad=True)
        with pytest.raises(RuntimeError, match="came twice in one backward.*use_reentrant=False"):
            model(x).sum().backward()


@pytest.mark.parametrize("in_backward", [False, True], ids=["step_after", "step_in_backward"])
def test_two_offloads_training_on_two_threads_at_once_train_as_the_plain_models(in_backward):
    """Each thread trains its own offloaded model; their backwards run at
    once (autograd runs without the GIL, so the gradient hooks count into
    each offload's lifecycle from both threads, and each unit's completion
    calls Python back under the GIL). Each model trains as its plain copy
    trained alone, bit for bit, and every unit's gradients went home (or
    stepped) once per backward."""
    import threading

    def train(model, optimizer, seed, out):
        g = torch.Generator().manual_seed(seed)
        for _ in range(6):
            x = torch.randn(64, 32, generator=g)
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        out.append([p.detach().clone() for p in model.parameters()])

    def models():
        torch.manual_seed(0)
        return [Net(4, 32, -1, True) for _ in range(2)]

    want = []
    for k, m in enumerate(models()):
        train(m, torch.optim.AdamW(m.parameters(), lr=0.01), k, want)
    got = [[], []]
    with cpu_streams():
        nets = models()
        runs = []
        for k, m in enumerate(nets):
            handle, executor = offload_on_cpu(m)
            opt = handle.stream_optimizer(torch.optim.AdamW(m.parameters(), lr=0.01),
                                          step_in_backward=in_backward)
            runs.append((m, opt, executor))
        threads = [threading.Thread(target=train, args=(m, opt, k, got[k]))
                   for k, (m, opt, _) in enumerate(runs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for k in range(2):
        assert got[k], f"thread {k} did not finish"
        assert all(torch.equal(a, b) for a, b in zip(got[k][0], want[k]))
        executor = runs[k][2]
        assert len([b for b in executor.backwards if b]) == 6
        assert all(sorted(b) == [0, 1, 2, 3] for b in executor.backwards if b)
