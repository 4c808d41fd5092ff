"""Larger than the GPU: the residency budget, offload, prefetching iterators,
prefetch_on_alloc (issue 10). Sizes stay at a few hundred MiB: "larger than
the GPU" means larger than the budget."""
import copy
import gc
import os
import sys
import weakref

import pytest
import torch

from conftest import (LAST_PREFETCH_LOCATION, gpu, memory_type, range_attribute, run_python,
                      where)
from offload_helpers import gpu_bytes, make_model, streamed_bytes_on_gpu, undo_leftover_offloads

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


@pytest.fixture
def budget(uvm):
    """A 64 MiB residency budget on cuda:0, removed afterwards; the peaks
    count from here (a test before may have held more under its own)."""
    uvm.set_residency_limit(64 * MiB)
    uvm.reset_peak_memory_stats()
    yield 64 * MiB
    undo_leftover_offloads()
    uvm.set_residency_limit(None)


def all_resident_output(x):
    """What make_model() gives for `x` with every weight on the GPU."""
    with torch.no_grad():
        return make_model().cuda()(x)


def test_residency_limit_bad_input(uvm):
    # ("1G": GiB or GB? a size names its unit)
    for bad, error in [(0, ValueError), (-5, ValueError), (1.5, ValueError), ("1G", ValueError),
                       (b"1", TypeError), (uvm.get_memory_cap() + 1, ValueError)]:
        with pytest.raises(error):
            uvm.set_residency_limit(bad)
    uvm.set_residency_limit(0.01)
    assert uvm.get_residency_limit() == int(0.01 * uvm.get_memory_cap())
    uvm.set_residency_limit(None)
    assert uvm.get_residency_limit() is None


def watch_residency(model):
    """Hooks, run after offload's, that note the bytes of weights on the GPU
    as each submodule starts: the peak is measured, not accounted."""
    peak = [0]

    def note(*_):
        peak[0] = max(peak[0], gpu_bytes(model))
    hooks = [m.register_forward_pre_hook(note) for m in model.modules()]
    return peak, hooks


def test_offloaded_model_matches_all_resident_within_its_budget(uvm, budget):
    x = torch.randn(16, 2048, device="cuda")
    want = all_resident_output(x)
    model = make_model()                                  # 8 x 16 MiB = 128 MiB of weights
    before = uvm.residency_stats()
    handle = uvm.offload(model, device="cuda", mode="prefetch")   # the 64 MiB budget
    homes = {id(p): p.data_ptr() for p in model.parameters()}     # where they live off the GPU
    assert all(p.is_cuda and memory_type(p) == "host" for p in model.parameters())  # pinned
    peak, hooks = watch_residency(model)
    with torch.no_grad():
        outs = [model(x) for _ in range(4)]
    torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out, want)                     # bit-identical
    s = uvm.residency_stats()
    assert 0 < peak[0] <= budget                          # measured by the driver
    assert s["resident_bytes.peak"] <= budget
    assert handle.residency_stats()["resident_bytes.peak"] <= budget
    assert s["evictions.drop"] > before["evictions.drop"]              # streamed, not kept
    assert s["evictions.write_home"] == before["evictions.write_home"]  # nothing written
    resident = handle.resident_units()
    assert 0 < len(resident) < len(handle.units)          # some stay, the rest streams
    # for inference, the last ones in the order: the streamed ones' kernels queue first
    assert handle.units_in_order()[-len(resident):] == resident
    for u in handle.units:                                # where each weight is, by the driver
        w = u.module.weight
        if u in resident:
            # a slot of device memory (managed memory halves the copies' speed)
            assert memory_type(w) == "device" and w.data_ptr() != homes[id(w)]
        elif handle.executor.bytes_on_gpu(u.index) == 0:
            assert where(w) == "host" and w.data_ptr() == homes[id(w)]   # its home
    assert "residency.cuda:0.resident_bytes.peak" in uvm.memory_stats()
    for h in hooks:
        h.remove()
    handle.undo()
    assert not any(uvm.is_managed(p) and p.is_cuda for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(model.cuda()(x), want)         # the values survived the undo


def test_streamed_weights_are_copied_into_gpu_memory_ahead_of_their_use(uvm, budget):
    # While submodule i runs, submodule i + 1 is already in GPU memory (a
    # slot, not its home), and a streamed submodule that ran has left.
    x = torch.randn(256, 2048, device="cuda")
    model = make_model()
    handle = uvm.offload(model, mode="prefetch")
    with torch.no_grad():
        model(x)                                          # learns the order
    order = handle.units_in_order()
    streamed = [u for u in order if u not in handle.resident_units()]
    seen = []

    def check(unit):
        def hook(*_):
            i = streamed.index(unit)
            w = unit.module.weight
            nxt = streamed[(i + 1) % len(streamed)]
            seen.append((where(w),
                         handle.executor.bytes_on_gpu(nxt.index) == nxt.nbytes,
                         handle.executor.bytes_on_gpu(streamed[i - 2].index)))
        return hook
    hooks = [u.module.register_forward_pre_hook(check(u)) for u in streamed]
    with torch.no_grad():
        out = model(x)
    torch.cuda.synchronize()
    for h in hooks:
        h.remove()
    assert torch.equal(out, all_resident_output(x))
    assert len(seen) == len(streamed) >= 3
    for running, next_ready, two_back in seen:
        assert running == "gpu"      # the running one reads GPU memory
        assert next_ready            # the next one was brought ahead
        assert two_back == 0         # one that ran two submodules ago has left
    handle.undo()


def test_an_optimizer_made_before_offload_is_rebound_and_one_that_stepped_is_refused(uvm, budget):
    """rebind_optimizer: an optimizer over the parameters offload replaced
    names the offload's instead and streams; one that stepped before is
    refused with its groups as they were; another model's parameters stay."""
    model, other = make_model(layers=4, width=1024), torch.nn.Linear(4, 4)   # (trains in 64 MiB)
    fresh = torch.optim.SGD([*model.parameters(), *other.parameters()], lr=0.1)
    stepped = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # (states)
    model(torch.randn(2, 1024)).sum().backward()
    stepped.step()
    before = [list(g["params"]) for g in stepped.param_groups]
    handle = uvm.offload(model, device="cuda")
    with pytest.raises(ValueError, match="holds state for 8 of the parameters offload replaced"):
        handle.rebind_optimizer(stepped)
    assert [list(g["params"]) for g in stepped.param_groups] == before
    with pytest.raises(ValueError, match="as they were before offload"):
        handle.stream_optimizer(fresh)
    original = fresh.param_groups[0]["params"][0]          # layer 0's weight before offload
    replacement = next(iter(model.parameters()))           # and the offload's in its place
    twice = torch.optim.SGD([{"params": [replacement]}, {"params": [original]}], lr=0.1)
    with pytest.raises(ValueError, match="would hold one parameter twice"):
        handle.rebind_optimizer(twice)
    assert twice.param_groups[1]["params"][0] is original   # unchanged
    assert handle.rebind_optimizer(fresh) is fresh
    params = fresh.param_groups[0]["params"]
    assert [id(p) for p in params] == [id(p) for p in [*model.parameters(), *other.parameters()]]
    handle.stream_optimizer(fresh)
    model.zero_grad()
    model(torch.randn(2, 1024, device="cuda")).sum().backward()
    fresh.step()
    handle.undo()
    with pytest.raises(ValueError, match="rebind_optimizer of an offload undone"):
        handle.rebind_optimizer(fresh)


def test_an_offload_inside_an_offload_is_refused_and_changes_nothing(uvm):
    """A part of an offloaded module, a module holding one, and a module
    holding one of its parameters (tied before the offload) are refused by
    name before anything changes; the offload streams on bit for bit, and
    after its undo() the part offloads."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    outside = torch.nn.Linear(256, 256)
    outside.weight = model[1].weight                      # a module beside it, tied
    parent = torch.nn.Sequential(torch.nn.Linear(256, 256), model)
    x = torch.randn(4, 256, device="cuda")
    want = copy.deepcopy(model).cuda()(x)
    handle = uvm.offload(model, budget=MiB)
    part = model[3]
    before = [(p, p.data_ptr()) for m in (part, parent[0], outside) for p in m.parameters()]
    for m, how in [(part, "is a part of the offloaded Sequential"),
                   (parent, "holds the offloaded Sequential"),
                   (outside, "shares tensors with the offloaded Sequential")]:
        with pytest.raises(RuntimeError, match=f"{how}.*undo\\(\\) on the handle"):
            uvm.offload(m, budget=MiB)
        assert getattr(m, "_torch_uvm_offloaded", None) is None
    assert all(a is b and a.data_ptr() == ptr for (a, ptr), b in
               zip(before, [p for m in (part, parent[0], outside) for p in m.parameters()]))
    assert torch.equal(model(x), want)
    handle.undo()
    uvm.offload(part, budget=MiB).undo()


def test_offload_bad_input_changes_nothing(uvm, budget):
    model = make_model(layers=4)
    params = [p for p in model.parameters()]
    with pytest.raises(ValueError, match=r"submodule '0' \(16785408 bytes\)"):
        uvm.offload(model, budget=16 * MiB)               # below 2 x the largest layer
    assert all(a is b for a, b in zip(model.parameters(), params)) and \
        not any(p.is_cuda for p in model.parameters())
    for bad in [0, -1, uvm.get_memory_cap() + 1, "20G", "a lot"]:
        with pytest.raises(ValueError):
            uvm.offload(model, budget=bad)
    assert all(a is b for a, b in zip(model.parameters(), params)) and \
        not any(p.is_cuda for p in model.parameters())
    uvm.offload(model, budget="40MiB").undo()             # a size as people write it
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

    # each weight gets its home in pinned host memory; the third fails
    def home_twice_then_fail(t, device, real=uvm._C.pinned_home):
        if len(made) == 2:
            raise RuntimeError("injected: out of pinnable memory")
        made.append(t)
        return real(t, device)
    monkeypatch.setattr(uvm._C, "pinned_home", home_twice_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        uvm.offload(model)
    assert len(made) == 2
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert all(p.device.type == "cpu" for p in params)
    assert all(torch.equal(p, q) for p, q in zip(params, make_model(layers=4).parameters()))
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    monkeypatch.undo()
    uvm.offload(model).undo()                             # and it can be offloaded later


def test_offload_holds_the_weights_once_on_the_host_and_gives_back_a_gpu_copy(uvm, budget):
    # The tensors the module had keep no memory while it is offloaded: those
    # on the CPU read their homes (the host holds the weights once, not
    # twice), those on the GPU give theirs back. Seen in the allocator's
    # books, apart from the offload's (with UVM on, both are its memory).
    x = torch.randn(4, 2048, device="cuda")
    weights = sum(p.nbytes for p in make_model().parameters())          # 128 MiB
    for where_first in ("cpu", "cuda"):
        model = make_model().to(where_first)
        ids = [id(p) for p in model.parameters()]   # (a list of them would hold them)
        before = uvm.memory_stats()["allocated_bytes.all.current"]
        handle = uvm.offload(model)
        after = uvm.memory_stats()["allocated_bytes.all.current"]
        assert before - after >= weights, (where_first, before, after)
        with torch.no_grad():
            assert torch.equal(model(x), all_resident_output(x))
        handle.undo()
        params = list(model.parameters())
        assert [id(p) for p in params] == ids                 # the same tensors
        assert all(p.device.type == where_first for p in params)
        assert all(torch.equal(p.cpu(), q) for p, q in zip(params, make_model().parameters()))
        if where_first == "cpu":            # over the homes, not a copy: pinned, the driver says
            assert all(p.is_pinned() and not uvm.is_managed(p) for p in params)


def test_a_cpu_model_goes_into_its_homes_without_a_second_copy_in_host_memory():
    # Measured by the kernel, apart from any books: the process's peak
    # resident memory (pinned homes count in it) grows by about one layer
    # while 256 MiB of weights move into their homes, not by the weights.
    # UVM off, as a user loading a model runs: the CPU tensors' memory goes
    # back to the host when freed.
    r = run_python("""
        import torch, torch_uvm
        def kib(key):
            return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key))
        torch.zeros(1, device='cuda')              # CUDA's context first
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(16)])
        weights = sum(p.nbytes for p in model.parameters())
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')                           # the peak (VmHWM) counts from here
        before = kib('VmRSS')
        handle = torch_uvm.offload(model, budget=64 << 20)
        print(weights >> 10, kib('VmHWM') - before, kib('VmRSS') - before)
    """, timeout=120)
    weights, peak, now = map(int, r.stdout.split())
    assert peak < weights // 4, (weights, peak, now)       # KiB


def test_undo_writes_back_into_a_tensor_held_elsewhere(uvm, budget):
    # A weight something else holds (a view of it, as state_dict()'s tensors
    # are) keeps its memory through the offload; undo() copies the trained
    # value back into it, so the view sees it, and allocates nothing.
    x = torch.randn(8, 1024, device="cuda")
    for where_first in ("cpu", "cuda"):
        model = make_model(layers=4, width=1024).to(where_first)
        view = model[0].weight.view(-1)
        ptr = view.data_ptr()
        handle = uvm.offload(model)
        optimizer = handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        model(x).square().mean().backward()
        optimizer.step()
        trained = model[0].weight.detach().cpu()
        handle.undo()
        assert model[0].weight.data_ptr() == ptr and model[0].weight.device.type == where_first
        assert torch.equal(view.cpu(), trained.view(-1))
        assert not torch.equal(trained, make_model(layers=4, width=1024)[0].weight)  # it trained


def test_a_budget_refused_beside_others_pins_nothing(uvm, budget, monkeypatch):
    # The share is asked for before any home is pinned: refused (40 MiB can
    # stream two 16 MiB layers at a time, but only 16 of the 64 are left),
    # the module's CPU tensors keep their own (pageable) memory.
    holder = uvm.offload(make_model(layers=2), budget=48 * MiB)
    model = make_model(layers=4)
    pinned = []
    monkeypatch.setattr(uvm._C, "pinned_home",
                        lambda t, d, real=uvm._C.pinned_home: pinned.append(t) or real(t, d))
    with pytest.raises(ValueError, match="does not fit"):
        uvm.offload(model, budget=40 * MiB)
    assert pinned == [] and not any(p.is_pinned() for p in model.parameters())
    monkeypatch.undo()
    holder.undo()


def test_homes_the_host_cannot_hold_are_refused_before_any_is_pinned(uvm, budget, monkeypatch):
    offload_module = sys.modules["torch_uvm.offload"]     # (the package's `offload` is the function)
    model = make_model(layers=4)
    params = list(model.parameters())
    monkeypatch.setattr(offload_module, "host_room",
                        lambda: (8 * MiB, "the memory cgroup /'s memory.max (8388608 bytes)"))
    pinned = []
    monkeypatch.setattr(uvm._C, "pinned_home",
                        lambda t, d, real=uvm._C.pinned_home: pinned.append(t) or real(t, d))
    need = sum(p.nbytes for p in params)
    with pytest.raises(torch.OutOfMemoryError,
                       match=rf"needs {need} bytes of pinned host memory for its homes, and the "
                             rf"host has {8 * MiB} bytes available \(the memory cgroup /'s "
                             rf"memory.max"):
        uvm.offload(model)
    assert pinned == [] and getattr(model, "_torch_uvm_offloaded", None) is None
    assert all(a is b and torch.equal(a, c) for a, b, c in
               zip(model.parameters(), params, make_model(layers=4).parameters()))
    monkeypatch.undo()
    uvm.offload(model).undo()


def test_undo_that_cannot_put_the_weights_back_on_the_gpu_leaves_the_module_offloaded(
        uvm, budget, monkeypatch):
    x = torch.randn(4, 2048, device="cuda")
    model = make_model().cuda()
    handle = uvm.offload(model)
    real_to = torch.Tensor.to

    def no_room(t, *args, **kwargs):
        if kwargs.get("copy") and args and torch.device(args[0]).type == "cuda":
            raise torch.OutOfMemoryError("injected: CUDA out of memory")
        return real_to(t, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "to", no_room)
    with pytest.raises(torch.OutOfMemoryError, match=r"still offloaded: free GPU memory and call "
                                                     r"undo\(\) again"):
        handle.undo()
    monkeypatch.undo()
    assert model._torch_uvm_offloaded is handle
    with torch.no_grad():
        assert torch.equal(model(x), all_resident_output(x))   # it streams on
    handle.undo()
    assert all(p.is_cuda for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(model(x), all_resident_output(x))


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
    assert s["evictions.drop"] - before["evictions.drop"] >= 16 - 4


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


def test_each_offload_streams_within_its_own_share_whatever_the_order(uvm):
    # No limit: two offloads each get their budget. One evicts only its own
    # weights, so running both, interleaved, never exceeds either budget.
    assert uvm.get_residency_limit() is None
    x = torch.randn(16, 2048, device="cuda")
    want = all_resident_output(x)
    first, second = make_model(), make_model()
    a = uvm.offload(first, budget=64 * MiB, mode="prefetch")
    with torch.no_grad():
        assert torch.equal(first(x), want)
    b = uvm.offload(second, budget=48 * MiB, mode="prefetch")
    assert uvm.get_residency_limit() is None
    assert [(s["holder"], s["budget"]) for s in uvm.residency_shares()] == \
        [("Sequential", 64 * MiB), ("Sequential", 48 * MiB)]
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(second(x), want) and torch.equal(first(x), want)
    torch.cuda.synchronize()
    assert 0 < a.residency_stats()["resident_bytes.peak"] <= 64 * MiB
    assert 0 < b.residency_stats()["resident_bytes.peak"] <= 48 * MiB
    assert a.bytes_on_gpu() <= 64 * MiB and b.bytes_on_gpu() <= 48 * MiB
    # a limit bounds their sum: below it, refused, naming who holds the GPU
    with pytest.raises(ValueError, match=r"below the budgets .*Sequential \(67108864 bytes\)"):
        uvm.set_residency_limit(100 * MiB)
    uvm.set_residency_limit(128 * MiB)
    with pytest.raises(ValueError, match=r"does not fit .*Sequential \(50331648 bytes\)"):
        uvm.offload(make_model(layers=2), budget=40 * MiB)
    a.undo()
    uvm.offload(make_model(layers=2), budget=40 * MiB).undo()   # room again
    b.undo()
    assert uvm.residency_shares() == []
    uvm.set_residency_limit(None)


def test_a_budget_past_the_cap_beside_others_is_refused_before_anything_changes(uvm):
    cap = uvm.get_memory_cap()
    model = make_model(layers=2)
    params = list(model.parameters())
    holder = uvm.offload(make_model(layers=2), budget=cap // 2 + MiB)
    with pytest.raises(ValueError, match=r"managed memory cap"):
        uvm.offload(model, budget=cap // 2)
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    holder.undo()


def test_an_offload_dropped_without_undo_gives_back_what_it_held(uvm):
    # Its share of the budget and its weights' GPU memory: a notebook that
    # offloads a new model in place of the old one must not be refused, nor
    # keep the old weights.
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
    assert len(uvm.residency_shares()) == 1
    del model
    gc.collect()
    assert uvm.residency_shares() == []
    assert uvm.residency_stats()["resident_bytes.current"] == resident
    torch.cuda.synchronize()
    assert uvm.memory_stats()["allocated_bytes.all.current"] == allocated
    # dropped, not yet collected, holding most of the cap: a new offload
    # collects it rather than be refused
    cap = uvm.get_memory_cap()
    gc.disable()                              # (the collection below is offload's own)
    try:
        old = make_model()
        uvm.offload(old, budget=cap - 64 * MiB)
        del old
        uvm.offload(make_model(), budget=96 * MiB).undo()
    finally:
        gc.enable()
    assert uvm.residency_shares() == []


def test_offload_in_place_reads_streamed_weights_where_they_are(uvm, budget):
    x = torch.randn(16, 2048, device="cuda")
    want = all_resident_output(x)
    model = make_model()
    before = uvm.residency_stats()
    handle = uvm.offload(model, device="cuda")            # auto: 16 rows, no grad
    try:
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
        # no window: as many layers as the budget holds stay, and after the
        # first forward nothing moves, nothing leaves
        resident = handle.resident_units()
        assert len(resident) == budget // (16 * MiB + 8 * 1024)
        # the last ones in the order: the slow in-place kernels queue first
        assert handle.units_in_order()[-len(resident):] == resident
        assert after["prefetched_bytes"] == learned["prefetched_bytes"]
        assert after["resident_bytes.current"] <= budget
        for key in ("evictions.drop", "evictions.write_home"):
            assert after[key] == before[key]
        for u in handle.units:                            # read straight from the runtime
            w = u.module.weight
            if u in resident:
                assert where(w) == "gpu"               # GPU memory
            else:
                assert where(w) == "host"              # home: pinned host memory
        assert gpu_bytes(model) == sum(u.nbytes for u in resident)
    finally:
        handle.undo()


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


def test_offload_mode_auto_prefetches_small_inputs_when_its_window_costs_little(uvm, budget):
    """16 rows, no grad, submodules small beside the budget (a window of two
    takes 8 of its 64 MiB): copied at the link's speed, the streamed bytes
    cross sooner than read in place at 0.9 of it, so "auto" prefetches after
    the first forward (which read in place). With 16 MiB submodules (a
    window of half the budget) it reads in place: the test above."""
    x = torch.randn(16, 1024, device="cuda")
    model = make_model(layers=64, width=1024)             # 64 x 4 MiB
    with torch.no_grad():
        want = copy.deepcopy(model).cuda()(x)
    handle = uvm.offload(model, device="cuda")
    try:
        with torch.no_grad():
            outs = [model(x) for _ in range(2)]
            torch.cuda.synchronize()
            before = uvm.residency_stats()["prefetched_bytes"]
            outs.append(model(x))
        torch.cuda.synchronize()
        assert handle.mode == "prefetch"
        for out in outs:
            assert torch.equal(out, want)
        # copied to the GPU each pass (read in place, nothing would move)
        assert uvm.residency_stats()["prefetched_bytes"] > before
        assert 0 < len(handle.resident_units()) < len(handle.units)
    finally:
        handle.undo()


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


def test_streaming_holds_no_more_gpu_memory_than_its_budget_while_the_host_runs_ahead(
        uvm, budget):
    """The host queues a whole forward while the GPU sleeps. Each bring lets
    a slot go whose kernels have not run yet: that memory is reused in
    stream order by the next slot, not replaced by new memory while it
    waits for the host to see the GPU pass it. Measured by PyTorch's own
    allocator, which holds the slots alone (UVM on), apart from the
    budget's books: the memory it reserves from the GPU (a slot freed but
    held back counts as not allocated, and new memory is reserved). The
    GPU is still asleep once the host has queued it all: no draw waited on
    the host for the GPU to pass a slot."""
    x = torch.randn(16, 2048, device="cuda")
    with torch.no_grad():
        want = make_model(layers=16).cuda()(x)
    model = make_model(layers=16)                         # 16 x 16 MiB, a 64 MiB budget
    handle = uvm.offload(model, mode="prefetch")
    try:
        with torch.no_grad():
            model(x)                                      # learns the order, warms the kernels
            torch.cuda._sleep(1000)
            torch.cuda.synchronize()
            uvm.empty_cache()                             # the slots' cache too
            uvm.reset_peak_memory_stats()
            torch.cuda._sleep(1_000_000_000)              # the GPU sleeps ~0.6 s
            woke = torch.cuda.Event()
            woke.record()
            out = model(x)                                # the host queues it all meanwhile
            stats = uvm.memory_stats()                    # before the GPU wakes
            # no slot's reuse waited for the host to see the GPU pass it
            queued_asleep = not woke.query()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert queued_asleep
        streamed = [u for u in handle.units if u not in handle.resident_units()]
        assert len(streamed) >= 10                        # most of them streamed
        assert stats["slots.cuda:0.reserved_bytes.peak"] <= budget
    finally:
        handle.undo()


def test_a_resident_tied_embedding_streams_the_rest_through_a_smaller_window(uvm):
    """GPT-2's shape: an embedding whose weight the head shares, layers
    between. For inference the head stays resident at the end, with the
    embedding's weight; what streams is a layer at a time, so the window is
    two layers, not two embeddings, and more layers stay."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(1024, 1024) for _ in range(16)]             # 4 MiB each
    model = torch.nn.Sequential(torch.nn.Embedding(8192, 1024), *layers,   # 32 MiB
                                torch.nn.Linear(1024, 8192))
    model[-1].weight = model[0].weight
    ids = torch.randint(0, 8192, (4, 64), device="cuda")
    with torch.no_grad():
        want = model.cuda()(ids)
    model.cpu()
    budget = 80 * MiB                                     # 96 MiB of weights
    handle = uvm.offload(model, budget=budget, mode="prefetch")
    try:
        with torch.no_grad():
            outs = [model(ids) for _ in range(3)]
        torch.cuda.synchronize()
        for out in outs:
            assert torch.equal(out, want)
        resident = handle.resident_units()
        assert handle.units_in_order()[-len(resident):] == resident      # at the end
        names = [u.name for u in resident]
        assert str(len(model) - 1) in names               # the head, with the shared weight
        # a window of two 32 MiB units would leave 16 MiB: no room for the
        # head, nothing resident; two layers' (8 MiB) leaves room for it and ten
        assert len(resident) >= 10
        assert handle.residency_stats()["resident_bytes.peak"] <= budget
    finally:
        handle.undo()


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


def train_steps(model, optimizer, x, steps=4, between=None):
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5)
    losses = []
    for _ in range(steps):
        loss = model(x).square().mean()
        loss.backward()
        if between is not None:
            between()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()                         # set to None: the gradients die
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("in_backward", [False, True], ids=["step_after", "step_in_backward"])
def test_a_training_forward_brings_units_beyond_its_window_into_the_steps_empty_room(
        uvm, in_backward):
    """A training budget keeps room for a step's gradients and states, empty
    in a forward: the units after the window (ahead=1: one) come into it
    while earlier ones compute, so the link is not idle; nothing leaves for
    them, and the budget holds. Counted on the GPU as each unit starts
    (bytes_on_gpu of the units still to run), not from the books' brings;
    the losses stay all resident's, bit for bit."""
    torch.manual_seed(1)
    x = torch.randn(64, 1024, device="cuda")
    reference = make_model(width=1024).cuda()             # 8 x 4 MiB
    want = train_steps(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3), x)
    model = make_model(width=1024)
    handle = uvm.offload(model, budget=24 * MiB)          # a window and a step's room
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                        step_in_backward=in_backward)
    ahead, peak = [], [0]

    def look(unit):
        def hook(*_):
            peak[0] = max(peak[0], streamed_bytes_on_gpu(model, optimizer))
            if not (handle.training and handle.executor.planned()):
                return
            order = handle.units_in_order()
            later = [u for u in order[order.index(unit) + 1:]
                     if u not in handle.resident_units()]
            ahead.append(sum(handle.executor.bytes_on_gpu(u.index) == u.nbytes for u in later))
        return hook
    hooks = [u.module.register_forward_pre_hook(look(u)) for u in handle.units]
    try:
        got = train_steps(model, optimizer, x)
    finally:
        for h in hooks:
            h.remove()
    assert got == want
    assert ahead and max(ahead) >= 3, ahead        # the window alone: 1
    assert peak[0] <= 24 * MiB
    handle.undo()


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("in_backward", [False, True], ids=["step_after", "step_in_backward"])
def test_training_under_a_budget_gives_the_all_resident_losses(uvm, in_backward, fused):
    torch.manual_seed(1)
    x = torch.randn(64, 1024, device="cuda")
    reference = make_model(width=1024).cuda()             # 8 x 4 MiB
    want = train_steps(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3,
                                                    fused=fused), x)
    model = make_model(width=1024)
    budget = 24 * MiB                                     # weights alone take 32 MiB
    before = uvm.residency_stats()
    replaced = list(model.parameters())                   # what offload replaces
    handle = uvm.offload(model, budget=budget)
    with pytest.raises(ValueError, match="create the optimizer after"):
        handle.stream_optimizer(torch.optim.AdamW(replaced))
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3,
                                                          fused=fused),
                                        step_in_backward=in_backward)
    peak = [0]

    def note(*_):
        peak[0] = max(peak[0], streamed_bytes_on_gpu(model, optimizer))
    hooks = [m.register_forward_pre_hook(note) for m in model]
    hooks += [m.register_full_backward_pre_hook(note) for m in model]
    states_at_step = []     # where each state is when the optimizer's own step runs
    step_streams = set()    # and the stream it runs on

    def at_step(opt, *_):
        step_streams.add(torch.cuda.current_stream().cuda_stream)
        for group in opt.param_groups:
            for p in group["params"]:
                states_at_step.extend(
                    where(t) for t in opt.state.get(p, {}).values()
                    if isinstance(t, torch.Tensor) and t.is_cuda and t.nbytes >= 64 << 10)
        note()                                    # the step's own, beside the passes'
    hooks.append(optimizer.register_step_pre_hook(at_step))
    after_backward = []

    def look():                                   # between backward and step
        grads = [p.grad for p in model.parameters()]
        after_backward.append(
            None if in_backward and all(g is None for g in grads) else
            all(g is not None and where(g) == "host" for g in grads))
        note()
    try:
        got = train_steps(model, optimizer, x, between=look)
        torch.cuda.synchronize()
        assert handle.mode == "prefetch" and handle.training
        assert got == want                                # bit for bit
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.equal(p, q)
        # measured by the driver: weights, gradients and states on the GPU
        # never exceeded the budget
        assert 0 < peak[0] <= budget
        s = uvm.residency_stats()
        # the books, copies home under way included
        assert handle.residency_stats()["resident_bytes.peak"] <= budget
        # written weights and moments went home by a copy
        assert s["evictions.write_home"] > before["evictions.write_home"]
        ours = torch.cuda.current_stream().cuda_stream
        if in_backward:    # gradients stepped in backward, then died on the GPU
            assert after_backward == [None] * 4
            # on a stream of their own, beside the backward (which ran on ours)
            assert len(step_streams) == 1 and ours not in step_streams
            assert s["evictions.discard"] > before["evictions.discard"]
        else:              # gradients complete in backward went home at once
            assert after_backward == [True] * 4
            assert step_streams == {ours}
        # the optimizer's own step finds its states copied to the GPU (a
        # fused one too: in place over PCIe it would hold the SMs)
        assert len(states_at_step) == 3 * 16 and set(states_at_step) == {"gpu"}
        states = [t for p in model.parameters() for t in optimizer.state[p].values()
                  if t.is_cuda and t.nbytes >= 64 << 10]
        assert len(states) == 16 and all(where(t) == "host" for t in states)   # at home between steps
    finally:
        for h in hooks:
            h.remove()
        handle.undo()
    assert "step" not in optimizer.__dict__


@pytest.mark.parametrize("in_backward", [False, True], ids=["step_after", "step_in_backward"])
def test_training_holds_no_more_gpu_memory_than_its_budget_while_copies_go_home(
        uvm, in_backward):
    """A step writes weights, gradients and states home while the host runs
    ahead of a sleeping GPU. A slot whose copy home is under way is not free
    before the copy passes: the budget counts it until then, and the host
    waits for copies rather than draw new memory. Measured by PyTorch's own
    allocator, which holds the slots alone (UVM on): the memory it reserves
    from the GPU stays within the budget, beside one 2 MiB segment that
    holds the biases (PyTorch's allocator serves allocations under 1 MiB from
    segments of 2 MiB)."""
    torch.manual_seed(1)
    x = torch.randn(64, 2048, device="cuda")
    model = make_model()                                  # 8 x 16 MiB
    budget = 96 * MiB                                     # a step's four tensors take 64
    handle = uvm.offload(model, budget=budget)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                        step_in_backward=in_backward)
    try:
        for step in range(3):
            if step == 1:                                 # states exist: measure from here
                torch.cuda.synchronize()
                uvm.empty_cache()
                uvm.reset_peak_memory_stats()
            torch.cuda._sleep(100_000_000)                # the host runs ahead meanwhile
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        stats = uvm.memory_stats()
        assert handle.residency_stats()["resident_bytes.peak"] <= budget   # the books
        assert stats["slots.cuda:0.reserved_bytes.peak"] <= budget + 2 * MiB   # the GPU
        assert handle.residency_stats()["evictions.write_home"] > 0
    finally:
        handle.undo()


def test_a_first_step_makes_room_for_its_states_before_it_makes_them(uvm):
    """A first step makes its optimizer's states on the GPU, one submodule
    after another, while the host runs ahead of a sleeping GPU. Room for
    each submodule's states is made before its step (the host waits for
    the last ones' copies home), so the share's books, copies home under
    way included, never pass the budget, and what the step adds to the
    device's memory (mem_get_info after it, the states' blocks kept by the
    allocator's cache) stays within the budget.

    In a fresh process, after one AdamW step of a small resident model: a
    process's first step loads AdamW's kernels onto the device (CUDA's lazy
    loading), which mem_get_info counts. Without that step first, the
    measured step added 130 MiB under 96 in three GPU-alone runs of eleven,
    2 MiB in the others. Alone, this passes without the room too (the
    mutant "a first step makes its states without room" is killed by the
    training-loop tests listed with it)."""
    r = run_python(f"""
        import sys
        import torch, torch_uvm as uvm
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from offload_helpers import make_model
        MiB = 1 << 20
        uvm.set_enabled_uvm(True)
        warm = torch.nn.Linear(64, 64).cuda()                 # AdamW's kernels loaded
        warm_step = torch.optim.AdamW(warm.parameters(), lr=1e-3)
        warm(torch.randn(4, 64, device="cuda")).sum().backward()
        warm_step.step()
        del warm, warm_step
        torch.manual_seed(1)
        x = torch.randn(64, 2048, device="cuda")
        model = make_model(layers=16)                         # 16 x 16 MiB
        budget = 96 * MiB
        handle = uvm.offload(model, budget=budget)
        optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
        model(x).square().mean().backward()
        torch.cuda.synchronize()
        uvm.empty_cache()
        uvm.reset_peak_memory_stats()
        free = torch.cuda.mem_get_info()[0]
        torch.cuda._sleep(300_000_000)                        # the host runs ahead meanwhile
        optimizer.step()
        torch.cuda.synchronize()
        added = free - torch.cuda.mem_get_info()[0]
        print("books", handle.residency_stats()["resident_bytes.peak"] <= budget)   # the books
        print("device", added <= budget, added / MiB)                               # the device
        print("made", all(optimizer.state[p] for p in model.parameters()))         # it made them
        handle.undo()
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    books, device, made = r.stdout.splitlines()[:3]
    assert books == "books True" and made == "made True", r.stdout
    assert device.startswith("device True"), r.stdout


def make_blocks(blocks=6, width=1024):
    """GPT-2's mix of weight sizes, scaled down: per block 12, 4, 16 and 16
    MiB, and biases of KiB."""
    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, 3 * width), torch.nn.Linear(3 * width, width),
                   torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)]
    return torch.nn.Sequential(*layers)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_slots_of_mixed_sizes_hold_no_more_gpu_memory_than_the_budget(uvm, training):
    """Slots of several sizes, drawn and let go in turn while the host runs
    ahead: PyTorch's allocator would reserve more than it holds (each of its
    segments apart, never merged). Drawn from one range of the budget's
    size, the GPU memory the slots take (measured by PyTorch's allocator,
    which holds them alone with UVM on) is the budget, and no slot is drawn
    beside it."""
    x = torch.randn(64, 1024, device="cuda")
    model = make_blocks()                                 # 6 x 48 MiB
    budget = 120 * MiB
    with torch.no_grad():
        want = copy.deepcopy(model).cuda()(x)
    handle = uvm.offload(model, budget=budget, mode="prefetch")
    optimizer = (handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=1e-3,
                                                         momentum=0.9), step_in_backward=True)
                 if training else None)
    try:
        for step in range(4):
            if step == 1:                                 # planned: measure from here
                torch.cuda.synchronize()
                uvm.empty_cache()
                uvm.reset_peak_memory_stats()
                misses = uvm.memory_stats()["slots.cuda:0.arena_misses"]
            torch.cuda._sleep(50_000_000)                 # the host runs ahead meanwhile
            if training:
                model(x).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            else:
                with torch.no_grad():
                    out = model(x)
        torch.cuda.synchronize()
        stats = uvm.memory_stats()
        assert len(handle.resident_units()) < len(handle.units)          # it streams
        assert stats["slots.cuda:0.arena_bytes"] == budget
        assert stats["slots.cuda:0.arena_misses"] == misses
        assert stats["slots.cuda:0.reserved_bytes.peak"] <= budget        # the GPU
        assert handle.residency_stats()["resident_bytes.peak"] <= budget  # the books
        if not training:
            assert torch.equal(out, want)
    finally:
        handle.undo()
    torch.cuda.synchronize()
    assert uvm.memory_stats().get("slots.cuda:0.arena_bytes", 0) == 0   # given back with undo


def test_an_inference_arena_is_the_weights_when_the_budget_holds_them(uvm):
    """Inference with a budget above the weights: the range the slots come
    from is the weights' bytes, not the budget (no gradients or optimizer
    states will stream), and every submodule stays resident."""
    x = torch.randn(16, 1024, device="cuda")
    model = make_blocks(blocks=2)                         # 96 MiB
    weights = sum(p.nbytes for p in model.parameters())
    handle = uvm.offload(model, budget=256 * MiB, mode="prefetch")
    try:
        with torch.no_grad():
            model(x)
            model(x)
        torch.cuda.synchronize()
        arena = uvm.memory_stats()["slots.cuda:0.arena_bytes"]
        assert weights <= arena < weights + 2 * MiB
        assert len(handle.resident_units()) == len(handle.units)
    finally:
        handle.undo()


def test_profiler_traces_name_what_the_offload_moves(uvm, tmp_path):
    """torch_uvm's own work is in torch.profiler's trace, named by submodule,
    with its bytes; the copies it queued run on its streams, not the
    compute stream."""
    import json
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(1)
    x = torch.randn(64, 1024, device="cuda")
    model = make_model(width=1024)                        # 8 x 4 MiB
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), fused=True),
                                        step_in_backward=True)
    try:
        train_steps(model, optimizer, x, steps=1)         # learns the order
        streamed = [u for u in handle.units_in_order() if u not in handle.resident_units()]
        assert streamed
        before = handle.residency_stats()["prefetched_bytes"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     record_shapes=True) as prof:        # (arguments such as bytes)
            train_steps(model, optimizer, x, steps=1)
            torch.cuda.synchronize()
        moved = handle.residency_stats()["prefetched_bytes"] - before
        path = tmp_path / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
        ours = [e for e in events if e.get("name", "").startswith("torch_uvm::")]
        names = {e["name"] for e in ours}
        for u in streamed:                                # brought, each by name
            assert {f"torch_uvm::bring {u.name}", f"torch_uvm::bring_ahead {u.name}"} & names
        assert any(n.startswith("torch_uvm::write_home ") for n in names)
        assert any(n.startswith("torch_uvm::discard ") and n.endswith(".grad") for n in names)
        brings = [e for e in ours if e["name"] in (f"torch_uvm::bring {streamed[-1].name}",
                                                   f"torch_uvm::bring_ahead {streamed[-1].name}")]
        assert brings[0]["args"].get("bytes") == streamed[-1].nbytes
        # a bring's range is what crossed: none where the unit was on the
        # GPU already or the arena had no room, so the trace's bytes are
        # the books' (a range given a stream is also on the GPU's side)
        crossed = sum(e["args"].get("bytes", 0) for e in ours
                      if e.get("cat") == "user_annotation" and e["name"].split(" ")[0] in
                      ("torch_uvm::bring", "torch_uvm::bring_ahead", "torch_uvm::bring_for_step"))
        assert crossed == moved, (crossed, moved)
        # its copies ran on streams other than the kernels' (the only copy
        # there reads the loss back to the host: a few bytes)
        compute = torch.cuda.current_stream().cuda_stream
        copies = {e["args"].get("stream") for e in events
                  if e.get("cat") == "gpu_memcpy" and e["args"].get("bytes", 0) >= 1 << 20}
        kernels = {e["args"].get("stream") for e in events if e.get("cat") == "kernel"}
        assert copies and not copies & {7 if compute == 0 else compute}
        assert kernels
    finally:
        handle.undo()


def test_a_profile_of_an_offloaded_model_names_its_submodules(uvm, budget):
    """torch_uvm.profile's timeline: every streamed submodule arrives by name,
    and the share's peak in it is the budget's accounting, within budget."""
    x = torch.randn(16, 2048, device="cuda")
    model = make_model()
    handle = uvm.offload(model, mode="prefetch")
    device = torch.cuda.current_device()
    try:
        with torch.no_grad():
            model(x)                                      # learns the order
        torch.cuda.synchronize()
        uvm._C.residency_budget().reset_peak(device)
        with uvm.profile() as p:
            with torch.no_grad():
                model(x)
        events = p.timeline()
        streamed = [u.name for u in handle.units_in_order() if u not in handle.resident_units()]
        arrived = [e["label"] for e in events if e["kind"] == "arrive"]
        assert streamed and set(streamed) <= set(arrived)
        assert {e["holder"] for e in events} == {"Sequential"}
        peak = p.peaks()[f"cuda:{device} Sequential"]
        assert peak == handle.residency_stats()["resident_bytes.peak"] <= budget
    finally:
        handle.undo()


def test_step_in_backward_refuses_a_second_backward_before_the_step(uvm):
    x = torch.randn(16, 1024, device="cuda")
    model = make_model(layers=4, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        step_in_backward=True)
    try:
        model(x).sum().backward()
        with pytest.raises(RuntimeError, match="second backward before optimizer.step"):
            model(x).sum().backward()
        optimizer.step()
        model(x).sum().backward()                         # after a step: fine
        optimizer.step()
    finally:
        handle.undo()


def test_a_step_failing_half_way_says_what_stepped_and_holds_nothing(uvm):
    x = torch.randn(16, 1024, device="cuda")
    model = make_model(layers=6, width=1024)
    handle = uvm.offload(model, budget=24 * MiB)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    calls = [0]
    own = inner.step

    def failing_step(*a, **k):
        calls[0] += 1
        if calls[0] == 3:
            raise torch.OutOfMemoryError("injected: out of memory in the step")
        return own(*a, **k)
    inner.step = failing_step
    optimizer = handle.stream_optimizer(inner)
    try:
        model(x).square().mean().backward()
        with pytest.raises(torch.OutOfMemoryError, match="injected") as info:
            optimizer.step()
        note = "\n".join(getattr(info.value, "__notes__", []))
        assert "failed in submodule '2'" in note and "2 submodule(s) had stepped: ['0', '1']" in note
        torch.cuda.synchronize()
        # nothing but the resident prefix is on the GPU, nothing is held
        resident = sum(u.nbytes for u in handle.resident_units())
        assert handle.bytes_on_gpu() == resident
        assert handle.residency_stats()["resident_bytes.current"] == resident
        optimizer.zero_grad()
        model(x).square().mean().backward()               # and it trains on
        optimizer.step()
    finally:
        handle.undo()
    assert all(not p.is_cuda for p in model.parameters())


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


def test_a_gradient_read_right_after_it_went_home_is_the_gradient(uvm):
    """DDP reads each gradient on the compute stream from a hook that runs
    after torch_uvm's (to copy it into its bucket), then writes the averaged
    one back. A gradient sent home points at its home at once: the compute
    stream must not read it before the copy there lands (issue 21: DDP over
    offloaded replicas gave other losses than resident DDP). The copies
    home queue behind a sleep on their stream (about a tenth of a second),
    so a read that does not wait for them reads what the home held before."""
    torch.manual_seed(1)
    xs = [torch.randn(64, 1024, device="cuda") for _ in range(2)]
    reference = make_model(width=1024).cuda()
    want = []
    for x in xs:                                          # the weights never change (lr 0)
        reference.zero_grad(set_to_none=True)
        reference(x).square().mean().backward()
        want.append([p.grad.clone() for p in reference.parameters()])
    model = make_model(width=1024)                        # 8 x 4 MiB
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    read = {}
    # DDP's reducer hooks each parameter's gradient accumulator (a post hook
    # of its AccumulateGrad node), after torch_uvm's own hook there: so do
    # these (a post-accumulate-grad hook would run before torch_uvm's)
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in model.parameters()]
    hooks = [a.register_hook(lambda *_, p=p, i=i: read.__setitem__(i, p.grad.clone()))
             for i, (a, p) in enumerate(zip(accumulators, model.parameters()))]
    try:
        for x, grads in zip(xs, want):                    # the second: homes hold the first's
            read.clear()
            loss = model(x).square().mean()
            with torch.cuda.stream(torch.cuda.ExternalStream(handle.executor.home_stream())):
                torch.cuda._sleep(1 << 28)
            loss.backward()
            torch.cuda.synchronize()
            assert sorted(read) == list(range(len(grads)))
            for i, g in enumerate(grads):
                torch.testing.assert_close(read[i].cpu(), g.cpu(), rtol=0, atol=0, msg=f"grad {i}")
            optimizer.step()
            optimizer.zero_grad()                         # None: fresh gradients go home again
    finally:
        for h in hooks:
            h.remove()
        handle.undo()


@pytest.mark.parametrize("through", ["grad", "data"])
def test_a_step_reads_gradients_written_at_home_by_the_compute_stream(uvm, through):
    """DDP writes the averaged gradient into .grad (at its home) on the
    compute stream at the end of backward; the step's copies of the
    gradients to the GPU run on another stream and must come after it. So
    must a write through .data (averaging by hand), which moves no version
    counter."""
    torch.manual_seed(1)
    x = torch.randn(64, 1024, device="cuda")
    model = make_model(width=1024)                        # 8 x 4 MiB
    handle = uvm.offload(model, budget=24 * MiB)
    optimizer = handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    params = list(model.parameters())
    try:
        before = [p.detach().cpu() for p in params]
        model(x).square().mean().backward()
        assert any(where(p.grad) == "host" for p in params)   # gradients went home
        torch.cuda._sleep(200_000_000)                    # the write below lands late
        for p in params:                                  # in place, on the compute stream
            (p.grad if through == "grad" else p.grad.data).fill_(1.0)
        optimizer.step()
        torch.cuda.synchronize()
        for i, (p, w) in enumerate(zip(params, before)):
            assert torch.equal(p.detach().cpu(), w - 1.0), f"parameter {i}"
    finally:
        handle.undo()


def test_weights_a_step_wrote_on_a_stream_of_its_own_go_home_after_it(uvm):
    """An optimizer step run on a stream of its own writes the resident
    weights there, late; undo() on the main stream at once copies them home
    after that stream's work too, not only the main stream's."""
    x = torch.randn(64, 1024, device="cuda")
    model = make_model(layers=4, width=1024)              # 16 MiB: all resident
    want = copy.deepcopy(model).cuda()
    reference = torch.optim.SGD(want.parameters(), lr=0.1)
    handle = uvm.offload(model, budget=64 * MiB, mode="prefetch")
    optimizer = handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    side = torch.cuda.Stream()
    for step in range(2):
        want(x).square().mean().backward()
        reference.step()
        reference.zero_grad()
        model(x).square().mean().backward()
        if step == 0:                  # every kernel loaded now: a lazy load would hold
            optimizer.step()           # the host until the sleep below ends
            optimizer.zero_grad()
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
            continue
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)                # the step lands late
            optimizer.step()
    assert len(handle.resident_units()) == len(handle.units)
    handle.undo()                                         # the main stream, at once
    torch.cuda.synchronize()
    for i, (p, q) in enumerate(zip(model.parameters(), want.parameters())):
        assert torch.equal(p.detach().cpu(), q.detach().cpu()), f"parameter {i}"


def test_a_forward_brings_weights_written_at_home_after_the_write(uvm):
    """A weight written in place while at its home (on the compute stream)
    comes to the GPU for the next forward after that write: the output
    equals all resident's with the same writes, bit for bit. (Every layer
    is written, and differently: the resident last layers alone, zeroed,
    would hide stale layers before them.)"""
    x = torch.randn(64, 1024, device="cuda")
    model = make_model(width=1024)                        # 8 x 4 MiB
    reference = copy.deepcopy(model).cuda()
    handle = uvm.offload(model, budget=12 * MiB, mode="prefetch")
    try:
        with torch.no_grad():
            model(x)                                      # learns the order
            uvm.evict("cuda")          # room in the budget: the brings below evict nothing,
            for p in model.parameters():   # so no eviction's wait orders them after the
                p.mul_(1)                  # writes; and mul_'s kernel is loaded now: a
            torch.cuda.synchronize()       # lazy load would hold the host until the sleep ends
            streamed = [u for u in handle.units_in_order() if u not in handle.resident_units()]
            assert any(where(t) == "host" for u in streamed for t in u.targets)
            torch.cuda._sleep(2_000_000_000)              # the writes below land late (~1 s)
            for k, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
                p.mul_(1 + k / 8)                         # in place: the version moves
                q.mul_(1 + k / 8)
            out = model(x)
            want = reference(x)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
    finally:
        handle.undo()


def test_an_offload_whose_slot_range_does_not_fit_says_so_at_its_first_forward(uvm):
    """The slots' range (the budget's size) is drawn at the first forward:
    under a managed memory cap that other tensors fill, it is refused with
    torch.OutOfMemoryError naming the range, the budget and what to do;
    once the memory is free, the same module runs."""
    cap = uvm.get_memory_cap()
    x = torch.randn(16, 2048, device="cuda")
    with torch.no_grad():
        want = make_model(layers=4).cuda()(x)
    model = make_model(layers=4)                          # 4 x 16 MiB
    handle = uvm.offload(model, budget=48 * MiB, mode="prefetch")
    torch.cuda.synchronize()
    uvm.empty_cache()
    uvm._C.release_cached_slots()
    stats = uvm.memory_stats()
    used = stats["reserved_bytes.all.current"] + sum(
        v for k, v in stats.items() if k.startswith("slots.") and k.endswith("reserved_bytes.current"))
    # (a live tensor of an earlier test may keep a segment whose free part no
    # cache emptying returns: the filler, larger than all that is free in the
    # cache, takes a segment of its own)
    free_in_cache = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    uvm.set_memory_cap(used + free_in_cache + 80 * MiB)
    try:
        filler = torch.empty(free_in_cache + 48 * MiB, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.OutOfMemoryError, match=r"one range of GPU memory the size of "
                                                         r"its budget \(50331648 bytes here\)"):
            with torch.no_grad():
                model(x)
        del filler
        uvm.empty_cache()
        with torch.no_grad():
            got = model(x)
        assert torch.equal(got, want)
    finally:
        handle.undo()
        uvm.set_memory_cap(cap)


def test_autocast_keeps_no_copy_of_the_offloaded_weights_past_their_use():
    """Under autocast, the bf16 cast of each fp32 weight (a leaf that
    requires grad) stays in autocast's cache, on the GPU beside the budget,
    until the region ends, though nothing else holds it (no autograd here,
    as under activation checkpointing). Offloaded, a cast lives as long as
    its use. PyTorch's own allocator measures it, in a fresh process with
    UVM off; the user's cache setting is back after each forward, a failed
    one's too."""
    p = run_python("""
        import torch, torch_uvm
        MiB = 1 << 20
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(8)])
        x = torch.randn(4, 1024, device="cuda")

        def held_after_forward(m):   # PyTorch's allocated bytes a forward leaves in the region
            with torch.no_grad():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    m(x)                                 # the first forward learns the order
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = m(x)
                    held = torch.cuda.memory_allocated() - before
                    assert torch.is_autocast_cache_enabled()
            return held, y.float().cpu()
        resident, want = held_after_forward(model.cuda())   # the cache's 8 casts of 2 MiB
        handle = torch_uvm.offload(model, budget=12 * MiB, device="cuda")
        offloaded, got = held_after_forward(model)
        assert torch.equal(got, want)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            try:
                model(torch.randn(4, 7, device="cuda"))
            except RuntimeError:
                pass
            assert torch.is_autocast_cache_enabled(), "a failed forward left the cache off"
        torch.set_autocast_cache_enabled(False)
        model(x)
        assert not torch.is_autocast_cache_enabled(), "the user's setting was not kept"
        print("HELD", resident, offloaded, handle.residency_stats()["prefetched_bytes"])
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    resident, offloaded, brought = map(int, p.stdout.split("HELD")[1].split())
    assert resident >= 16 * MiB            # the cache, as PyTorch keeps it without an offload
    assert brought > 0                     # some weights streamed
    assert offloaded < 2 * MiB, offloaded  # not one weight's cast left


def test_an_offload_shows_its_progress_when_asked_and_only_then(uvm, capfd, monkeypatch):
    """Pinning the homes shows a progress line on stderr when asked for
    (progress=True) or by default from SHOW_FROM bytes (lowered here), none
    when TORCH_UVM_QUIET=1 silences the default or progress=False; the
    outputs stay the model's."""
    monkeypatch.delenv("TORCH_UVM_QUIET", raising=False)
    x = torch.randn(4, 256, device="cuda")
    monkeypatch.setattr(uvm.progress, "SHOW_FROM", 1)      # this small model counts as large
    for progress, quiet, shows in ((None, None, True), (None, "1", False), (True, "1", True),
                                   (False, None, False)):
        if quiet:
            monkeypatch.setenv("TORCH_UVM_QUIET", quiet)
        else:
            monkeypatch.delenv("TORCH_UVM_QUIET", raising=False)
        model = make_model(layers=4, width=256)
        with torch.no_grad():
            want = copy.deepcopy(model).cuda()(x)
        capfd.readouterr()
        handle = uvm.offload(model, budget=1 << 20, progress=progress)
        err = capfd.readouterr().err
        assert ("torch_uvm: pinning homes:" in err) == shows, err
        with torch.no_grad():
            assert torch.equal(model(x), want)
        handle.undo()
    with pytest.raises(ValueError, match="progress is True"):
        uvm.offload(make_model(layers=2, width=64), budget=1 << 20, progress="yes")


def test_a_budget_given_as_a_fraction_is_of_the_gpus_residency_limit(uvm, budget):
    """budget=0.5 under a 64 MiB residency limit streams within 32 MiB, its
    output the all-resident one's; a fraction outside (0, 1] changes nothing."""
    model = make_model(layers=16, width=1024)               # 16 x 4 MiB: streams in 32 MiB
    x = torch.randn(8, 1024, device="cuda")
    with torch.no_grad():
        want = copy.deepcopy(model).cuda()(x)
    with pytest.raises(ValueError, match=r"fractional budget must be in \(0, 1\]"):
        uvm.offload(model, budget=1.5)
    assert not any(p.is_cuda for p in model.parameters())
    handle = uvm.offload(model, budget=0.5)
    assert handle.budget == budget // 2
    with torch.no_grad():
        assert torch.equal(model(x), want)
    # (the weights take 64 MiB, so within 32 MiB some streamed)
    assert sum(p.nbytes for p in model.parameters()) > budget // 2
    assert 0 < handle.residency_stats()["resident_bytes.peak"] <= budget // 2
    handle.undo()
