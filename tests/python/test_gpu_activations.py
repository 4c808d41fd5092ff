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
    # both forms save each block's input through the hooks (the non-reentrant
    # one in _NoopSaveInputs); the first block's is x, a leaf, kept
    assert hooks.stats()["sent"] >= 1, hooks.stats()


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
    tensors of the forward stay, as many as the budget holds, whatever the
    forward's length."""
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
        # a budget of 16 MiB: the last four stay; in a forward twice as long
        # (8 MiB tensors) the last two
        hooks = torch_uvm.offload_activations(window=8 * MiB, budget=16 * MiB)
        held_budget, _ = held_after_forward(hooks)
        first = hooks.stats()
        x = torch.randn(2048, 1024, device="cuda", requires_grad=True)
        held_longer, _ = held_after_forward(hooks)
        longer = hooks.stats()
        print("BUDGET", first["stayed"], first["sent"], held_budget, held_longer,
              longer["stayed"] - first["stayed"], longer["stayed_bytes"] - first["stayed_bytes"])
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
    stayed, sent_then, held, held_longer, stayed_longer, stayed_longer_bytes = printed["BUDGET"]
    assert stayed == 4 and sent_then == sent - 4, (stayed, sent_then, sent)
    assert 16 * MiB <= held <= 16 * MiB + 16 * MiB, held
    assert stayed_longer == 2 and stayed_longer_bytes == 16 * MiB, stayed_longer
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


def test_a_saved_tensor_changed_in_place_is_an_error(uvm):
    """PyTorch stops checking saved tensors' versions once hooks save them;
    the context checks, whether the tensor went home or stayed."""
    for budget in (0, 64 * MiB):
        x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
        with uvm.offload_activations(budget=budget):
            y = (x * 2).sigmoid()                      # sigmoid saves its output
            y.mul_(2)
            loss = y.sum()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_expanded_tensors_are_kept_as_they_are(uvm):
    x = torch.randn(1024, 1, device="cuda", requires_grad=True)
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    with uvm.offload_activations(min_bytes=0) as hooks:
        e = (x * 2).expand(1024, 1024)                 # 4 KiB of memory, 4 MiB of elements
        loss = (e * w).sum()                           # mul saves e and w
    loss.backward()
    assert hooks.stats()["sent_bytes"] < MiB, hooks.stats()


def test_a_tensor_saved_by_every_layer_keeps_the_rest_coming_ahead(uvm):
    """An input every layer reads (an encoder's output): saved eight times,
    it is met in backward at its last save, so the layers' own activations
    are still brought before backward asks for them."""
    torch.manual_seed(0)
    enc = torch.randn(1024, 1024, device="cuda").sigmoid()
    ws = [torch.randn(1024, 1024, device="cuda", requires_grad=True) for _ in range(8)]
    h = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    with uvm.offload_activations(window=8 * MiB) as hooks:
        for w in ws:
            h = torch.nn.functional.gelu(h) * (enc @ w)
        loss = h.sum()
    loss.backward()
    s = hooks.stats()
    assert s["deduplicated"] == 7, s
    assert s["brought_late"] <= 2, s


def test_the_brought_activations_stay_within_the_window_when_backward_runs_ahead(uvm):
    """Backward's thread runs ahead of the GPU (here: behind a sleep queued
    before backward). A brought tensor's memory is the bring stream's again
    only once the GPU has run its last use: past the window, the thread
    waits for that, so the bring stream holds about a window, not every
    saved activation (32 of 4 MiB here, in segments of 20 MiB). The
    gradients are all-resident's."""
    model = chain(layers=16)
    x = torch.randn(1024, 1024, device="cuda")
    want = grads_of(model, x)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    uvm.empty_cache()           # (streams come from a pool: none of an earlier user's segments)
    hooks = uvm.offload_activations(window=8 * MiB)
    xg = x.detach().requires_grad_()
    with hooks:
        loss = model(xg).float().square().mean()
    torch.cuda.synchronize()
    torch.cuda._sleep(500_000_000)
    loss.backward()
    torch.cuda.synchronize()
    got = [loss.detach()] + [p.grad.clone() for p in model.parameters()] + [xg.grad.clone()]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    bring = hooks._streams_for(x.device)[1].cuda_stream
    held = sum(seg["total_size"] for seg in uvm.memory_snapshot() if seg["stream"] == bring)
    assert 0 < held <= 40 * MiB, (held, hooks.stats())
    assert hooks.stats()["sent"] >= 30 and hooks.stats()["waited_release"] > 0, hooks.stats()


def delayed(uvm, **kwargs):
    """offload_activations whose brings start late (the bring stream sleeps
    before each), so that a use that does not wait for its copy reads memory
    not yet written; the test also queues forward behind a sleep, so that a
    copy home that does not wait for the op that made its tensor reads it
    before it is written."""
    class Slow(uvm.offload_activations):
        def _bring(self, rec):
            with torch.cuda.stream(self._streams_for(rec.device)[1]):
                torch.cuda._sleep(20_000_000)
            super()._bring(rec)
    return Slow(**kwargs)


def test_results_hold_when_the_copies_run_late(uvm):
    model = chain(layers=4)
    x = torch.randn(512, 1024, device="cuda")
    want = grads_of(model, x)
    hooks = delayed(uvm, window=2 * MiB)
    grads_of(model, x, hooks)   # the homes are pinned once: pinning anew waits for the device
    model.zero_grad(set_to_none=True)
    poison = [torch.full((512, 1024), float("nan"), device="cuda") for _ in range(32)]
    del poison        # the blocks the activations will take hold NaN, not the last run's values
    xg = x.detach().requires_grad_()
    side = torch.cuda.Stream()                         # compute on a stream of its own
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)                 # forward's kernels queue behind this
        with hooks:
            loss = model(xg).float().square().mean()
        churn = [torch.randn(512, 1024, device="cuda") for _ in range(16)]   # reuse memory
        loss.backward()
        del churn
    torch.cuda.current_stream().wait_stream(side)
    got = [loss.detach()] + [p.grad.clone() for p in model.parameters()] + [xg.grad.clone()]
    assert_same(got, want)
    assert hooks.stats()["brought_late"] + hooks.stats()["brought_ahead"] > 0, hooks.stats()


def test_the_budget_keeps_the_last_saved_tensors(uvm):
    """Sixteen 4 MiB activations under a 16 MiB budget: the last four stay
    on the GPU (never sent), the twelve before go home."""
    class Seen(uvm.offload_activations):
        def _pack(self, t):
            out = super()._pack(t)
            if not isinstance(out, torch.Tensor):
                self.records.append(out)
            return out
    hooks = Seen(window=8 * MiB, budget=16 * MiB)
    hooks.records = []
    h = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    with hooks:
        for _ in range(16):
            h = torch.nn.functional.gelu(h * 1.5)       # gelu saves its input: 4 MiB
        loss = h.sum()
    stayed = [r.home is None for r in hooks.records]
    loss.backward()
    assert stayed == [False] * 12 + [True] * 4, stayed
    assert hooks.stats()["stayed"] == 4, hooks.stats()
