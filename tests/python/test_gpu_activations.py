"""Activation offload (torch_uvm.offload_activations): saved activations go
to pinned host memory during forward and come back ahead of backward. The
results must equal a run without it bit for bit; the memory it frees is
measured by PyTorch's own allocator in a fresh process (UVM off), and the
order of the brings by how many backward had to wait for."""
import pytest
import torch

from conftest import gpu, run_python
from offload_helpers import make_model

pytestmark = gpu
MiB = 1 << 20


def chain(layers=6, width=1024):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks).cuda()


def grads_of(model, x, hooks=None, backwards=1, autocast=False):
    """The loss and every gradient (and the input's) after `backwards`
    backward passes of one forward (retain_graph between them)."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        if hooks is None:
            loss = model(x).float().square().mean()
        else:
            with hooks:
                loss = model(x).float().square().mean()
    for i in range(backwards):
        loss.backward(retain_graph=i + 1 < backwards)
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


def assert_same(a, b):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert torch.equal(u, v), f"tensor {i} differs: max {(u - v).abs().max().item()}"


@pytest.mark.parametrize("autocast", [False, True])
def test_gradients_equal_a_run_without_it_bit_for_bit(uvm, autocast):
    model = chain()
    x = torch.randn(512, 1024, device="cuda")
    want = grads_of(model, x, autocast=autocast)
    hooks = uvm.offload_activations(window=4 * MiB)
    got = grads_of(model, x, hooks, autocast=autocast)
    assert_same(got, want)
    s = hooks.stats()
    assert s["sent"] >= 6, s           # each layer's input and its GELU's went home
    assert s["brought_ahead"] + s["brought_late"] + s["used_in_place"] >= s["sent"], s
    again = grads_of(model, x, hooks, autocast=autocast)   # the context, entered again
    assert_same(again, want)


def test_retain_graph_brings_the_activations_again(uvm):
    model = chain(layers=3)
    x = torch.randn(512, 1024, device="cuda")
    want = grads_of(model, x, backwards=2)
    hooks = uvm.offload_activations(window=2 * MiB)
    got = grads_of(model, x, hooks, backwards=2)
    assert_same(got, want)
    assert hooks.stats()["brought_bytes"] > hooks.stats()["sent_bytes"], hooks.stats()


@pytest.mark.parametrize("reentrant", [False, True])
def test_with_activation_checkpointing(uvm, reentrant):
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = chain(layers=4)

        def forward(self, x):
            for i in range(0, len(self.blocks), 2):
                x = checkpoint(self.blocks[i:i + 2], x, use_reentrant=reentrant)
            return x

    model = Checkpointed()
    x = torch.randn(512, 1024, device="cuda")
    want = grads_of(model, x)
    hooks = uvm.offload_activations(window=2 * MiB)
    assert_same(grads_of(model, x, hooks), want)
    if reentrant:   # the reentrant form saves each block's input through the hooks
        assert hooks.stats()["sent"] >= 3, hooks.stats()


def test_weights_and_small_tensors_stay(uvm):
    """Parameters and other leaves that require grad (and views of them, as
    a linear's transposed weight) are kept, so are tensors under min_bytes
    and CPU tensors."""
    model = chain(layers=2, width=1024)
    x = torch.randn(8, 1024, device="cuda", requires_grad=True)   # 32 KiB activations
    with uvm.offload_activations() as hooks:
        loss = model(x).sum()
        cpu = (torch.randn(64, 64, requires_grad=True) ** 2).sum()
    loss.backward()
    cpu.backward()
    s = hooks.stats()
    assert s["sent"] == 0, s
    assert s["kept"] >= 4, s
    with uvm.offload_activations(min_bytes=0) as hooks:
        model(x).sum().backward()
    s = hooks.stats()
    assert s["sent"] >= 3 and s["kept"] >= 3, s    # the activations went; x and the weights did not


def test_a_tensor_saved_twice_goes_home_once_and_comes_back_once(uvm):
    w = [torch.randn(1024, 1024, device="cuda", requires_grad=True) for _ in range(3)]
    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    h = x * 2                                        # saved by the three matmuls below
    with uvm.offload_activations(window=0) as hooks:
        loss = sum((h @ wi).sum() for wi in w)
    loss.backward()
    want = [wi.grad.clone() for wi in w]
    s = hooks.stats()
    assert s["deduplicated"] == 2 and s["sent"] == 1, s
    assert s["brought_bytes"] == s["sent_bytes"], s   # brought once for its three uses
    for wi in w:
        wi.grad = None
    sum((h.detach() @ wi).sum() for wi in w).backward()
    assert_same([wi.grad for wi in w], want)


def test_with_an_offloaded_model_training(uvm):
    """Weights streamed by torch_uvm.offload and activations sent home by
    offload_activations: the same weights after three steps as all
    resident, bit for bit."""
    x = torch.randn(256, 1024, device="cuda")

    def train(offloaded: bool):
        model = make_model(layers=6, width=1024)
        if offloaded:
            handle = uvm.offload(model, budget=24 * MiB, device="cuda")
            opt = handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        else:
            model.cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hooks = uvm.offload_activations(window=2 * MiB) if offloaded else None
        losses = []
        for _ in range(3):
            if hooks is None:
                loss = torch.nn.functional.gelu(model(x)).square().mean()
            else:
                with hooks:
                    loss = torch.nn.functional.gelu(model(x)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        weights = [p.detach().cpu().clone() for p in model.parameters()]
        if offloaded:
            assert hooks.stats()["sent"] > 0
            handle.undo()
        return losses, weights

    want_losses, want = train(False)
    got_losses, got = train(True)
    assert got_losses == want_losses
    assert_same(got, want)


def test_activations_leave_the_gpu_and_come_back_ahead_of_backward():
    """In a fresh process with UVM off, PyTorch's allocator says what a
    forward leaves on the GPU: eight layers' activations (64 MiB) without
    the context, at most a window and the last layer's with it. Backward
    waits for at most one bring: the others were on their way before it
    asked (in the reverse of forward's order). With a budget, the last
    tensors of the forward stay, within the budget even when the forward
    is longer than the one it learnt from."""
    p = run_python("""
        import torch, torch_uvm
        MiB = 1 << 20
        torch.manual_seed(0)
        blocks = []
        for _ in range(8):
            blocks += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
        model = torch.nn.Sequential(*blocks).cuda()
        x = torch.randn(1024, 1024, device="cuda", requires_grad=True)   # 4 MiB activations

        def held_after_forward(hooks):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            if hooks is None:
                loss = model(x).square().mean()
            else:
                with hooks:
                    loss = model(x).square().mean()
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - before
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
            peak = torch.cuda.max_memory_allocated() - before
            return held, peak
        held_resident, _ = held_after_forward(None)
        hooks = torch_uvm.offload_activations(window=8 * MiB)
        held_offloaded, peak = held_after_forward(hooks)
        s = hooks.stats()
        print("HELD", held_resident, held_offloaded, peak, s["sent"], s["brought_late"],
              s["brought_ahead"], s["used_in_place"])
        # a budget of 16 MiB: from the second forward, the last four stay; a
        # forward twice as long keeps no more than the budget all the same
        hooks = torch_uvm.offload_activations(window=8 * MiB, budget=16 * MiB)
        held_offloaded, _ = held_after_forward(hooks)
        first = hooks.stats()
        held_second, _ = held_after_forward(hooks)
        second = hooks.stats()
        x = torch.randn(2048, 1024, device="cuda", requires_grad=True)
        held_longer, _ = held_after_forward(hooks)
        longer = hooks.stats()
        print("BUDGET", first["stayed"], second["stayed"] - first["stayed"],
              second["sent"] - first["sent"], held_second, held_longer,
              longer["stayed_bytes"] - second["stayed_bytes"])
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    printed = {line.split()[0]: list(map(int, line.split()[1:]))
               for line in p.stdout.splitlines() if line.startswith(("HELD ", "BUDGET "))}
    resident, offloaded, peak, sent, late, ahead, in_place = printed["HELD"]
    assert resident >= 60 * MiB, resident           # 16 activations of 4 MiB, and the loss's
    assert offloaded <= 8 * MiB + 8 * MiB, offloaded   # a window, and the last layer's two
    assert sent >= 15, sent
    assert late <= 1, (late, ahead, in_place)        # the rest came back before they were asked
    assert ahead + late + in_place >= sent
    assert peak < resident, (peak, resident)         # backward too holds less than all of them
    stayed_first, stayed, sent_then, held, held_longer, stayed_longer = printed["BUDGET"]
    assert stayed_first == 0                          # nothing learnt yet: all went
    assert stayed == 4 and sent_then == sent - 4, (stayed, sent_then, sent)
    assert 16 * MiB <= held <= 16 * MiB + 16 * MiB, held
    assert stayed_longer <= 16 * MiB, stayed_longer
    assert held_longer <= 16 * MiB + 8 * MiB + 16 * MiB, held_longer   # budget, window, last two


def test_forward_waits_for_its_copies_past_the_window():
    """Sixteen cheap ops on 16 MiB tensors: compute runs far ahead of the
    copies home, so forward must wait for them, or hold every tensor still
    on its way. PyTorch's allocator (a fresh process, UVM off) says it holds
    about a window: 256 MiB without the context, at most the window and the
    last two tensors with it."""
    p = run_python("""
        import torch, torch_uvm
        MiB = 1 << 20
        x = torch.randn(2048, 2048, device="cuda", requires_grad=True)
        hooks = torch_uvm.offload_activations(window=32 * MiB)

        def held_after_forward(with_hooks):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            y = x
            with hooks if with_hooks else torch.autograd.graph.saved_tensors_hooks(
                    lambda t: t, lambda t: t):
                for _ in range(16):
                    y = torch.nn.functional.gelu(y)
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - before
            y.sum().backward()
            return held
        resident = held_after_forward(False)
        held_after_forward(True)                 # the homes are pinned once
        offloaded = held_after_forward(True)
        print("HELD", resident, offloaded, hooks.stats()["waited"])
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(l for l in p.stdout.splitlines() if l.startswith("HELD "))
    resident, offloaded, waited = map(int, line.split()[1:])
    assert resident >= 15 * 16 * MiB, resident
    assert offloaded <= 32 * MiB + 2 * 16 * MiB, (offloaded, waited)
