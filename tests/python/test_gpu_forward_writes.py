"""Buffers a forward writes keep every write, as all resident. BatchNorm's
running statistics are written by the batch_norm kernels without moving the
buffers' version counters, and a write through ``.data`` moves none either:
an offload that sent home only tensors whose version moved lost them all.
Each case runs all resident and offloaded, in every mode, and compares
outputs, losses, weights, buffers and the optimizer's states bit for bit,
before undo(), after it, and through a checkpoint."""
import io

import pytest
import torch

from conftest import gpu
from differential import everything
from offload_helpers import gpu_bytes, undo_leftover_offloads

pytestmark = gpu
MiB = 1 << 20
MODES = ["in_place", "prefetch", "auto"]


@pytest.fixture(autouse=True)
def nothing_left_streamed():
    """Deterministic convolutions (the two runs must agree bit for bit),
    and nothing left streamed afterwards."""
    was = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = was
    if torch.cuda.is_available():
        undo_leftover_offloads()
        torch.cuda.synchronize()


class LastMean(torch.nn.Module):
    """Keeps the mean of its last input in a buffer not saved in a
    state_dict, written through .data (its version unmoved), and counts its
    calls in a saved one (an in-place add: its version moves)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("last", torch.zeros(()), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.last.data.copy_(x.detach().mean())
        self.calls += 1
        return x


class Tally(torch.nn.Module):
    """Adds the largest magnitude of each input to a buffer, through .data
    alone: no version of its unit's moves (BatchNorm's num_batches_tracked
    moves, and so does LastMean's count), and a write lost shows."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(()))

    def forward(self, x):
        self.total.data.add_(x.detach().abs().amax())
        return x


class Stall(torch.nn.Module):
    """Queues a sleep on the current stream (about a tenth of a second): the
    kernels after it run late, while the host goes on ahead. It holds no
    tensor, so it is no unit of an offload."""

    def forward(self, x):
        torch.cuda._sleep(1 << 28)
        return x


def conv_bn_net(layers=10, width=64):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.BatchNorm2d(width),
                   torch.nn.ReLU()]
    return torch.nn.Sequential(Tally(), *blocks, LastMean(), Tally(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(width, 10))


def tally_last_net(width=64):
    """Two Linears (16,640 bytes each, no buffer), a Stall, and a Tally last."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width),
                               Stall(), Tally())


def total_bytes(model) -> int:
    return sum(t.nbytes for t in list(model.parameters()) + list(model.buffers()))


def some_streamed(handle, resident=True) -> bool:
    """Part of the net streamed, and, `resident`, the rest resident."""
    return (0 < len(handle.resident_units()) or not resident) and \
        len(handle.resident_units()) < len(handle.units)


def batches(steps=4, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(8, 64, 8, 8, device="cuda", generator=g),
             torch.randint(0, 10, (8,), device="cuda", generator=g)) for _ in range(steps)]


def train_then_evaluate(model, optimizer, data):
    losses = []
    model.train()
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    model.eval()
    with torch.no_grad():
        evaluated = model(data[0][0])
    return losses, evaluated


def assert_same(got, want):
    assert got.keys() == want.keys()
    wrong = [k for k in want if not torch.equal(got[k], want[k])]
    assert not wrong, f"{len(wrong)} differ from all resident: {wrong[:6]}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("in_backward", [False, True], ids=["step_after", "step_in_backward"])
def test_a_forward_writes_to_buffers_persist_in_training(uvm, mode, in_backward):
    """A conv net with BatchNorm (1.5 MB) trained under 1 MiB (most units stream),
    SGD with momentum, then evaluated: its running statistics, its
    num_batches_tracked, a buffer written through .data, outputs, losses,
    weights and momenta equal all resident's; after undo() too; and a
    state_dict saved from the offload loads into a resident model that
    evaluates the same."""
    data = batches()
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    reference = conv_bn_net().cuda()
    ref_opt = make(reference)
    want = train_then_evaluate(reference, ref_opt, data)
    want_all = everything(reference, ref_opt)

    model = conv_bn_net()
    handle = uvm.offload(model, budget=1 * MiB, mode=mode)
    optimizer = handle.stream_optimizer(make(model), step_in_backward=in_backward)
    got = train_then_evaluate(model, optimizer, data)
    torch.cuda.synchronize()
    assert some_streamed(handle, resident=False)   # (a step's room takes the rest)
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0])), "losses"
    assert torch.equal(got[1], want[1]), "evaluated outputs"
    assert_same(everything(model, optimizer), want_all)
    assert gpu_bytes(model) <= 1 * MiB          # the driver's word, apart from the books

    saved = io.BytesIO()
    torch.save(model.state_dict(), saved)
    handle.undo()      # (the optimizer's states follow the parameters put back)
    assert_same(everything(model, optimizer), want_all)
    saved.seek(0)
    loaded = conv_bn_net().cuda()
    loaded.load_state_dict(torch.load(saved))
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(data[0][0]), want[1])


@pytest.mark.parametrize("mode", MODES)
def test_a_forward_writes_to_buffers_persist_without_grad(uvm, mode):
    """BatchNorm's statistics recomputed without grad (the model in train(),
    as a recalibration pass runs it), under a budget that keeps part of the
    net resident: the buffers of resident and streamed units equal all
    resident's, before and after undo(). The GPU runs behind the host (a
    sleep queued first): a first forward that reads in place writes the
    statistics in their homes, and the plan after it brings the resident
    units' copies only after those writes."""
    data = batches(steps=5, seed=3)
    reference = conv_bn_net().cuda()
    model = conv_bn_net()
    handle = uvm.offload(model, budget=total_bytes(model) * 3 // 4, mode=mode)
    for m in (reference, model):
        m.train()
        torch.cuda.synchronize()
        torch.cuda._sleep(1 << 28)     # (about a tenth of a second)
        with torch.no_grad():
            outs = [m(x) for x, _ in data]
        m.outs = outs
    torch.cuda.synchronize()
    assert some_streamed(handle)
    assert "32" in [u.name for u in handle.resident_units()]   # a Tally: brought by the plan
    assert all(torch.equal(a, b) for a, b in zip(model.outs, reference.outs))
    assert_same(everything(model), everything(reference))
    handle.undo()
    assert_same(everything(model), everything(reference))


def test_a_buffer_written_in_its_home_is_brought_after_the_write(uvm):
    """mode="in_place": a forward without grad in train() reads the streamed
    units in place, and a Tally writes its buffer in its home on the compute
    stream, the GPU behind the host (a sleep queued first). The training
    forward after it plans anew and brings the first units to stay, that
    Tally among them: the copy is made after the write, and the buffers,
    weights and momenta equal all resident's. (The re-plan first evicts the
    inference plan's resident units, and each slot that leaves makes the
    bring stream wait for the compute stream: StreamedTensor::leave. The
    next test isolates the bring's own wait.)"""
    data = batches(steps=3, seed=5)
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    reference = conv_bn_net().cuda()
    model = conv_bn_net()
    # all but the first Tally (4 bytes) stays for inference; a training plan
    # keeps the window of a step (8 of the 148 KB convolutions) beside the
    # first units
    handle = uvm.offload(model, budget=total_bytes(model) - 4, mode="in_place")
    pairs = [(reference, make(reference)), (model, handle.stream_optimizer(make(model)))]
    for m, optimizer in pairs:
        m.train()
        with torch.no_grad():
            m(data[0][0])                 # the plan for inference: the last units stay
        if m is model:
            assert "0" not in [u.name for u in handle.resident_units()]
        torch.cuda.synchronize()
        torch.cuda._sleep(1 << 28)        # (about a tenth of a second)
        with torch.no_grad():
            m(data[1][0])                 # read in place: the Tally adds in its home
        x, y = data[2]
        torch.nn.functional.cross_entropy(m(x), y).backward()
        optimizer.step()
    torch.cuda.synchronize()
    assert "0" in [u.name for u in handle.resident_units()]   # the first units stay now
    assert_same(everything(model, pairs[1][1]), everything(reference, pairs[0][1]))


def test_a_buffer_the_first_forward_wrote_in_its_home_is_brought_after_the_write(uvm):
    """mode="in_place": the first forward (without grad) reads every unit in
    place, and the Tally, last, adds to its buffer in its home on the compute
    stream, after a sleep the Stall queued just before it. The plan at that
    forward's end keeps the second Linear and the Tally and brings them: the
    Tally's copy is made after its write, and outputs and buffers equal all
    resident's, before undo() and after it (the second forward adds in the
    slot, which then goes home).
    Nothing but the Tally's bring orders that copy after the write: nothing
    was on the GPU, so no slot leaves before the plan (a slot leaving makes
    the bring stream wait for the compute stream); the Linear brought before
    it has no buffer and nothing written; the Tally's buffer is written
    through .data, so no version moves in its bring; and the offload's own
    setup ran before the sleep. Without the mark its run in place leaves
    (StreamExecutor::ran_at_home), the copy reads the home before the write
    lands and the Tally loses its first input."""
    g = torch.Generator(device="cuda").manual_seed(7)
    data = [torch.randn(8, 64, device="cuda", generator=g) for _ in range(2)]
    reference = tally_last_net().cuda()
    model = tally_last_net()
    # the suffix that fits: the second Linear and the Tally (the first
    # Linear, 16,640 bytes, does not fit beside them)
    handle = uvm.offload(model, budget=total_bytes(model) - 1024, mode="in_place")
    outs = {}
    for m in (reference, model):
        torch.cuda.synchronize()      # the GPU idle: the Stall alone puts it behind
        with torch.no_grad():
            outs[m] = [m(x) for x in data]
    torch.cuda.synchronize()
    assert [u.name for u in handle.resident_units()] == ["1", "3"]
    assert all(torch.equal(a, b) for a, b in zip(outs[model], outs[reference]))
    assert_same(everything(model), everything(reference))
    handle.undo()
    assert_same(everything(model), everything(reference))
