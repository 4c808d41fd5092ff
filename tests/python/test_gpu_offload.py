"""Larger than the GPU: the residency budget, offload, prefetching iterators,
prefetch_on_alloc (issue 10). Sizes stay at a few hundred MiB: "larger than
the GPU" means larger than the budget."""
import copy
import gc
import weakref

import pytest
import torch

from conftest import (LAST_PREFETCH_LOCATION, PREFERRED_LOCATION, READ_MOSTLY, gpu,
                      range_attribute, run_python)

pytestmark = gpu
MiB = 1 << 20


@pytest.fixture(autouse=True)
def nothing_left_streamed():
    """Each test starts with nothing streamed on the GPU, and leaves nothing
    (a batch held by the budget would keep a segment alive for later tests)."""
    yield
    import torch_uvm
    if torch.cuda.is_available():
        undo_leftover_offloads()
        torch_uvm.set_residency_limit(None)
        torch.cuda.synchronize()
        torch_uvm.evict()


def undo_leftover_offloads():
    """A failed test's offloads live on in its traceback: undo them, so the
    next tests start without them (and without the limit they set)."""
    from torch_uvm.offload import Offloaded
    gc.collect()
    # type(), not isinstance: that reads every object's __class__, and some warn
    for handle in [o for o in gc.get_objects() if type(o) is Offloaded]:
        if getattr(handle.module, "_torch_uvm_offloaded", None) is handle:
            handle.undo()


@pytest.fixture
def budget(uvm):
    """A 64 MiB residency budget on cuda:0, removed afterwards."""
    uvm.set_residency_limit(64 * MiB)
    yield 64 * MiB
    undo_leftover_offloads()
    uvm.set_residency_limit(None)


def make_model(layers=8, width=2048):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def all_resident_output(x):
    """What make_model() gives for `x` with every weight on the GPU."""
    with torch.no_grad():
        return make_model().cuda()(x)


def test_residency_limit_bad_input(uvm):
    for bad, error in [(0, ValueError), (-5, ValueError), (1.5, ValueError), ("1G", TypeError),
                       (uvm.get_memory_cap() + 1, ValueError)]:
        with pytest.raises(error):
            uvm.set_residency_limit(bad)
    uvm.set_residency_limit(0.01)
    assert uvm.get_residency_limit() == int(0.01 * uvm.get_memory_cap())
    uvm.set_residency_limit(None)
    assert uvm.get_residency_limit() is None


def test_offloaded_model_matches_all_resident_within_its_budget(uvm, budget):
    x = torch.randn(16, 2048, device="cuda")
    want = all_resident_output(x)
    model = make_model()                                  # 8 x 16 MiB = 128 MiB of weights
    before = uvm.residency_stats()
    handle = uvm.offload(model, device="cuda", mode="prefetch")   # the 64 MiB budget
    assert all(p.is_cuda and uvm.is_managed(p) for p in model.parameters())
    with torch.no_grad():
        outs = [model(x) for _ in range(4)]
    torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out, want)                     # bit-identical
    s = uvm.residency_stats()
    assert s["resident_bytes.peak"] <= budget
    assert s["evictions.drop_copy"] > before["evictions.drop_copy"]   # streamed, not kept
    assert s["evictions.migrate"] == before["evictions.migrate"]      # never copied back
    streamed = [u for u in handle.units if not u.resident]
    assert 0 < len(streamed) < len(handle.units)          # a resident prefix, the rest streams
    assert "residency.cuda:0.resident_bytes.peak" in uvm.memory_stats()
    handle.undo()
    assert not any(uvm.is_managed(p) and p.is_cuda for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(model.cuda()(x), want)         # the values survived the undo


def test_offload_bad_input_changes_nothing(uvm, budget):
    model = make_model(layers=4)
    params = [p for p in model.parameters()]
    with pytest.raises(ValueError, match=r"submodule '0' \(16785408 bytes\)"):
        uvm.offload(model, budget=16 * MiB)               # below 2 x the largest layer
    assert all(a is b for a, b in zip(model.parameters(), params)) and \
        not any(p.is_cuda for p in model.parameters())
    for bad in [0, -1, uvm.get_memory_cap() + 1]:
        with pytest.raises(ValueError):
            uvm.offload(model, budget=bad)
    handle = uvm.offload(model)
    with pytest.raises(RuntimeError, match="already offloaded"):
        uvm.offload(model)
    handle.undo()
    uvm.offload(model).undo()                             # again after an undo
    small = make_model(layers=2)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capture"):
        with torch.cuda.graph(g):
            uvm.offload(small)
    assert getattr(small, "_torch_uvm_offloaded", None) is None


def test_offload_failing_half_way_leaves_the_module_as_it_was(uvm, budget, monkeypatch):
    model = make_model(layers=4)
    params = list(model.parameters())
    made = []

    # UVM is on: the CPU weights are managed already, and each is seen on
    # the GPU through alias_on_device; the third fails
    def alias_twice_then_fail(t, device, real=uvm._C.alias_on_device):
        if len(made) == 2:
            raise RuntimeError("injected: out of managed memory")
        made.append(t)
        return real(t, device)
    monkeypatch.setattr(uvm._C, "alias_on_device", alias_twice_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        uvm.offload(model)
    assert len(made) == 2
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    monkeypatch.undo()
    uvm.offload(model).undo()                             # and it can be offloaded later


def test_offload_refuses_meta_weights_and_moves_empty_ones(uvm, budget):
    meta = torch.nn.Linear(64, 64, device="meta")
    with pytest.raises(ValueError, match="meta device"):
        uvm.offload(meta)
    assert meta.weight.is_meta and getattr(meta, "_torch_uvm_offloaded", None) is None
    model = make_model(layers=2)
    model[0].register_buffer("empty", torch.empty(0))
    x = torch.randn(4, 2048, device="cuda")
    with torch.no_grad():
        want = copy.deepcopy(model).cuda()(x)
    handle = uvm.offload(model)
    with torch.no_grad():
        out = model(x)
    assert model[0].empty.is_cuda and model[0].empty.numel() == 0
    assert torch.equal(out, want)
    handle.undo()


def test_prefetching_streams_batches_within_the_budget(uvm, budget):
    data = torch.arange(64 * MiB // 4 * 4, dtype=torch.float32)   # 256 MiB, managed, on the CPU
    batches = list(data.split(4 * MiB))                   # 16 MiB each
    before = uvm.residency_stats()
    total = torch.zeros((), dtype=torch.float64, device="cuda")
    seen = 0
    for batch in uvm.prefetching(batches, "cuda", ahead=2):
        assert batch.is_cuda and uvm.is_managed(batch)
        # the current stream waits for the batch's prefetch: once it has
        # drained, the prefetch was issued
        torch.cuda.current_stream().synchronize()
        assert range_attribute(batch, LAST_PREFETCH_LOCATION) == 0
        total += batch.double().sum()
        seen += 1
    torch.cuda.synchronize()
    assert seen == 16 and total.item() == float(data.double().sum())
    s = uvm.residency_stats()
    assert s["resident_bytes.peak"] <= budget
    assert s["prefetched_bytes"] - before["prefetched_bytes"] == 256 * MiB
    assert s["evictions.drop_copy"] - before["evictions.drop_copy"] >= 16 - 4


def test_environment_keys_for_larger_than_gpu():
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        print(torch_uvm._C.residency_budget().limit(0) >> 20)   # the copy kernels' view
        print(torch_uvm.get_residency_limit() >> 20)
        x = torch.empty(1 << 22, device='cuda')
        torch.cuda.synchronize()
        import sys; sys.path.insert(0, %r)
        from conftest import range_attribute, LAST_PREFETCH_LOCATION
        print(range_attribute(x, LAST_PREFETCH_LOCATION))
    """ % __import__("os").path.dirname(__file__),
        env={"PYTORCH_UVM_ALLOC_CONF": "residency_limit_mb:512,prefetch_on_alloc:true"})
    assert r.stdout.split() == ["512", "512", "0"], r.stdout + r.stderr


def test_undoing_one_of_two_offloads_keeps_the_limit_for_the_other(uvm):
    # The first offload's budget became the limit; the second streams under
    # it. Undoing the first must not leave the second without a budget.
    assert uvm.get_residency_limit() is None
    first = uvm.offload(make_model(layers=2), budget=64 * MiB)
    second = uvm.offload(make_model(layers=2), budget=48 * MiB)
    first.undo()
    assert uvm.get_residency_limit() == 64 * MiB
    second.undo()
    assert uvm.get_residency_limit() is None


def test_a_limit_an_offload_would_not_stream_under_is_refused(uvm):
    # Removing the limit, or lowering it below a live offload's budget, would
    # let the module stream without its budget: refused, nothing changed.
    assert uvm.get_residency_limit() is None
    model = make_model(layers=2)
    handle = uvm.offload(model, budget=64 * MiB)
    with pytest.raises(ValueError, match=r"no residency limit .* undo\(\) the offload first"):
        uvm.set_residency_limit(None)
    with pytest.raises(ValueError, match=r"Sequential \(budget 67108864 bytes\).*smaller budget"):
        uvm.set_residency_limit(32 * MiB)
    assert uvm.get_residency_limit() == 64 * MiB
    uvm.set_residency_limit(128 * MiB)        # above the budget: the user's limit now,
    handle.undo()                             # so undo leaves it
    assert uvm.get_residency_limit() == 128 * MiB
    del handle                                # (an undone handle still holds the module)
    uvm.offload(model, budget=64 * MiB)
    del model                                 # dropped without undo (in a reference
    uvm.set_residency_limit(None)             # cycle): no offload any more
    assert uvm.get_residency_limit() is None


def test_an_offload_dropped_without_undo_gives_back_what_it_held(uvm):
    # Its limit, its place in the budget and its weights' memory: a notebook
    # that offloads a new model in place of the old one must not be refused,
    # nor keep the old weights.
    assert uvm.get_residency_limit() is None
    x = torch.randn(16, 2048, device="cuda")
    all_resident_output(x)      # (cuBLAS's workspace for this stream is made now, not below)
    torch.cuda.synchronize()
    allocated = uvm.memory_stats()["allocated_bytes.all.current"]
    resident = uvm.residency_stats()["resident_bytes.current"]
    model = make_model()
    uvm.offload(model, budget=64 * MiB, mode="prefetch")
    with torch.no_grad():
        model(x)
    assert uvm.residency_stats()["resident_bytes.current"] > resident
    assert uvm.get_residency_limit() == 64 * MiB
    del model
    gc.collect()
    assert uvm.get_residency_limit() is None
    assert uvm.residency_stats()["resident_bytes.current"] == resident
    assert uvm.memory_stats()["allocated_bytes.all.current"] == allocated
    gc.disable()                              # (the collection below is offload's own)
    try:
        old = make_model()
        uvm.offload(old, budget=64 * MiB)     # its budget becomes the limit
        del old                               # dropped, not yet collected: a larger
        uvm.offload(make_model(), budget=96 * MiB).undo()   # budget is not refused
    finally:
        gc.enable()
    assert uvm.get_residency_limit() is None


def test_an_offload_budget_is_enforced_without_a_device_limit(uvm):
    # The budget passed to offload becomes the device's residency limit when
    # it has none (the first benchmark run kept all 2 GiB resident: it did not).
    assert uvm.get_residency_limit() is None
    x = torch.randn(16, 2048, device="cuda")
    model = make_model()
    before = uvm.residency_stats()
    handle = uvm.offload(model, budget=64 * MiB, mode="prefetch")
    assert uvm.get_residency_limit() == 64 * MiB
    with torch.no_grad():
        for _ in range(3):
            model(x)
    torch.cuda.synchronize()
    after = uvm.residency_stats()
    assert after["evictions.drop_copy"] > before["evictions.drop_copy"]
    assert after["resident_bytes.current"] <= 64 * MiB
    with pytest.raises(ValueError, match="residency limit"):
        uvm.offload(make_model(layers=2), budget=128 * MiB)   # above the limit it set
    handle.undo()
    assert uvm.get_residency_limit() is None


def test_offload_in_place_reads_streamed_weights_where_they_are(uvm, budget):
    x = torch.randn(16, 2048, device="cuda")
    want = all_resident_output(x)
    model = make_model()
    for p in model.parameters():      # a reused block remembers its last prefetch
        uvm.prefetch(p, "cpu")
    torch.cuda.synchronize()
    before = uvm.residency_stats()
    handle = uvm.offload(model, device="cuda")            # auto: 16 rows, no grad
    try:
        check_in_place(uvm, handle, model, x, want, before, budget)
    finally:
        handle.undo()
    assert range_attribute(model[-1].weight, PREFERRED_LOCATION) != -1


def check_in_place(uvm, handle, model, x, want, before, budget):
    with torch.no_grad():
        first = model(x)
        torch.cuda.synchronize()
        learned = uvm.residency_stats()
        outs = [model(x) for _ in range(3)]
    torch.cuda.synchronize()
    assert handle.mode == "in_place"
    for out in [first] + outs:
        assert torch.equal(out, want)
    after = uvm.residency_stats()
    # no window: as many layers as the budget holds stay, and nothing moves
    # after the first forward, nothing leaves
    resident = [u for u in handle.units if u.resident]
    assert len(resident) == budget // (16 * MiB + 8 * 1024)
    assert after["prefetched_bytes"] == learned["prefetched_bytes"]
    assert after["resident_bytes.current"] <= budget
    for key in ("evictions.drop_copy", "evictions.migrate"):
        assert after[key] == before[key]
    for u in handle.units:                                # read straight from the runtime
        w = u.module.weight
        assert range_attribute(w, READ_MOSTLY) == 0
        if u.resident:
            assert range_attribute(w, LAST_PREFETCH_LOCATION) == 0
        else:
            assert range_attribute(w, PREFERRED_LOCATION) == -1     # home: the CPU
            assert range_attribute(w, LAST_PREFETCH_LOCATION) == -1  # never brought


def test_offload_mode_auto_prefetches_for_large_inputs_and_training(uvm, budget):
    with torch.no_grad():
        h = uvm.offload(make_model(layers=4))
        h.module(torch.randn(1024, 2048, device="cuda"))  # 1024 rows: prefetch
        assert h.mode == "prefetch"
        h.undo()
        ids = uvm.offload(torch.nn.Embedding(1000, 64))
        ids.module(torch.zeros(4, 64, dtype=torch.long, device="cuda"))   # 256 tokens
        assert ids.mode == "prefetch"
        ids.undo()
    h = uvm.offload(make_model(layers=4))
    h.module(torch.randn(16, 2048, device="cuda"))        # grad enabled
    assert h.mode == "prefetch"
    h.undo()
    with pytest.raises(ValueError, match="mode"):
        uvm.offload(make_model(layers=2), mode="zero_copy")


def test_offload_keeps_tied_weights_tied(uvm, budget):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(4096, 1024), torch.nn.Linear(1024, 4096))
    model[1].weight = model[0].weight                     # tied, as GPT-2's wte and lm_head
    ids = torch.randint(0, 4096, (2, 8), device="cuda")
    want = model.cuda()(ids).detach()
    model.cpu()
    handle = uvm.offload(model)
    assert model[1].weight is model[0].weight
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(ids), want)
    handle.undo()
    assert model[1].weight is model[0].weight


def test_prefetching_lets_go_of_batches_and_of_a_loop_left_early(uvm, budget):
    refs = []

    def batches():
        for _ in range(16):
            t = torch.ones(4 * MiB)                       # 16 MiB, managed, on the CPU
            refs.append(weakref.ref(t))
            yield t
    for _ in uvm.prefetching(batches(), "cuda", ahead=1):
        pass
    torch.cuda.synchronize()
    # what the budget still holds (64 MiB = 4 batches) may stay referenced,
    # every batch that left is let go
    assert sum(r() is not None for r in refs) <= 4
    for i, _ in enumerate(uvm.prefetching(batches(), "cuda", ahead=2)):
        if i == 1:
            break                                         # two batches staged, one in use
    torch.cuda.synchronize()
    uvm.bring(torch.ones(16 * MiB - 1024), "cuda")        # the whole budget: nothing busy


def test_training_under_a_budget_gives_the_all_resident_losses(uvm):
    torch.manual_seed(1)
    x = torch.randn(64, 1024, device="cuda")

    def train(model, optimizer, steps=4):
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5)
        losses = []
        for _ in range(steps):
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()                         # set to None: the gradients die
            losses.append(loss.item())
        return losses
    reference = make_model(width=1024).cuda()             # 8 x 4 MiB
    want = train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3))
    model = make_model(width=1024)
    budget = 24 * MiB                                     # weights alone take 32 MiB
    uvm.reset_peak_memory_stats()
    before = uvm.residency_stats()
    handle = uvm.offload(model, budget=budget)
    with pytest.raises(ValueError, match="create the optimizer after"):
        handle.stream_optimizer(torch.optim.AdamW(make_model(layers=1).parameters()))
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    try:
        got = train(model, optimizer)
        torch.cuda.synchronize()
        assert handle.mode == "prefetch" and handle.training
        assert got == want                                # bit for bit
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.equal(p, q)
        s = uvm.residency_stats()
        assert s["resident_bytes.peak"] <= budget
        # written weights, gradients and moments went home; dead gradients
        # were forgotten, not moved
        assert s["evictions.migrate"] > before["evictions.migrate"]
        assert s["evictions.discard"] > before["evictions.discard"]
        assert all(uvm.is_managed(t) for p in model.parameters()
                   for t in optimizer.state[p].values() if t.is_cuda)
    finally:
        handle.undo()
    assert "step" not in optimizer.__dict__


def test_training_steps_a_tied_weight_once(uvm):
    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Embedding(4096, 1024), torch.nn.Linear(1024, 4096))
        m[1].weight = m[0].weight
        return m
    ids = torch.randint(0, 4096, (4, 64), device="cuda")

    def train(model, optimizer):
        losses = []
        for _ in range(3):
            loss = model(ids).float().square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses
    reference = make().cuda()
    want = train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2))
    model = make()
    handle = uvm.offload(model, budget=96 * MiB)
    try:
        got = train(model, handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2)))
        assert got == want
        assert model[1].weight is model[0].weight
    finally:
        handle.undo()


def test_evict_lets_everything_not_in_use_leave(uvm, budget):
    t = torch.ones(4 * MiB)                               # 16 MiB, managed
    ref = weakref.ref(t)
    uvm.bring(t, "cuda")
    torch.cuda.synchronize()
    assert uvm.residency_stats()["resident_bytes.current"] == 16 * MiB
    del t
    uvm.evict()
    assert uvm.residency_stats()["resident_bytes.current"] == 0
    assert ref() is None                                  # torch_uvm let go of it
    with torch.no_grad():                                 # planned for inference ...
        h = uvm.offload(make_model(layers=2))
        h.module(torch.randn(16, 2048, device="cuda"))
    with pytest.raises(ValueError, match="planned for inference"):   # ... not for training
        h.stream_optimizer(torch.optim.SGD(h.module.parameters(), lr=0.1))
    h.undo()
