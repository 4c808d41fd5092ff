"""Managed tensors and zero-copy moves on a GPU (skipped without one).
UVM is on for this whole session (conftest)."""
import io
import pickle

import pytest
import torch

from conftest import (LAST_PREFETCH_LOCATION, PREFERRED_LOCATION, READ_MOSTLY, gpu, multigpu,
                      range_attribute, run_python)

pytestmark = gpu


def test_new_cpu_and_cuda_tensors_are_managed(uvm):
    assert uvm.get_enabled_uvm()
    cpu, gpu = torch.ones(16), torch.ones(16, device="cuda")
    assert cpu.is_managed() and gpu.is_managed()
    stats = uvm.memory_stats()
    assert stats["allocated_bytes.all.current"] > 0


def test_rfc_usage_examples_one_by_one(uvm):
    tensor = torch.arange(1024, dtype=torch.float16)          # managed, on the CPU
    forced = tensor.to(device="cpu", dtype=torch.float32, copy=True)  # copy forced
    assert forced.data_ptr() != tensor.data_ptr() and forced.dtype == torch.float32
    changed = tensor.to(device="cuda:0", copy=False, dtype=torch.float32)  # dtype change: copy
    assert changed.device.type == "cuda" and changed.data_ptr() != tensor.data_ptr()
    assert changed.is_managed()
    managed = torch.arange(8).unmanage_memory().manage_memory()  # copy to managed
    assert managed.is_managed()
    moved = tensor.to(device="cuda:0")                           # same memory
    assert moved.device == torch.device("cuda", 0) and moved.data_ptr() == tensor.data_ptr()
    back = moved.to(device="cpu", non_blocking=True)             # no sync issued
    torch.cuda.synchronize()
    assert back.data_ptr() == tensor.data_ptr()
    plain = tensor.unmanage_memory()                             # standard tensor
    assert not plain.is_managed() and torch.equal(plain, tensor)


def test_moves_are_zero_copy_and_bit_exact(uvm):
    x = torch.randn(1 << 20)
    reference = x.clone()
    y = x.to("cuda")
    assert y.is_cuda and y.data_ptr() == x.data_ptr() and y.is_managed()
    assert torch.equal(y.cpu(), reference)
    y.mul_(2)                          # in place on the GPU, seen by the CPU alias
    torch.cuda.synchronize()
    assert torch.equal(x, reference * 2)
    z = y.to("cpu")
    assert z.data_ptr() == x.data_ptr() and torch.equal(z, reference * 2)
    assert y.cuda() is y and z.cpu() is z


def test_large_moves_prefetch_off_thread_and_kernels_see_the_data(uvm):
    # 64 MiB: above the inline limit, so a worker thread issues the prefetch
    # and the stream waits for it. Kernels queued right after the call, on
    # the default or a side stream, must read what the CPU wrote just before.
    x = torch.arange(16 << 20, dtype=torch.int32)
    side = torch.cuda.Stream()
    for round in range(4):
        x.add_(1)                                   # CPU writes, pages on the host
        stream = side if round % 2 else torch.cuda.current_stream()
        # The driver's counters: the kernel reads every page without a fault
        with uvm.expect_no_gpu_faults(x):
            with torch.cuda.stream(stream):
                y = x.to("cuda", non_blocking=True)
                assert y.data_ptr() == x.data_ptr()
            # The stream waits for the worker's prefetch: once it is done, the
            # prefetch was issued. (A data check cannot tell: a prefetch never
            # changes data, and page faults would bring the same bytes.)
            stream.synchronize()
            assert range_attribute(y, LAST_PREFETCH_LOCATION) == 0, "the stream did not wait"
            with torch.cuda.stream(stream):
                z = y * 2
            stream.synchronize()
        expected = (torch.arange(16 << 20, dtype=torch.int32) + round + 1) * 2
        assert torch.equal(z.cpu(), expected)
        del y, z


def test_moves_work_with_async_prefetch_off():
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        x = torch.ones(16 << 20)
        y = x.to('cuda')
        print(y.data_ptr() == x.data_ptr(), y.sum().item())
    """, env={"PYTORCH_UVM_ALLOC_CONF": "async_prefetch:false"})
    assert r.stdout.split() == ["True", str(float(16 << 20))], r.stdout + r.stderr


def test_cuda_born_tensor_moves_to_cpu_after_its_kernels(uvm):
    a = torch.full((4096, 1024), 3.0, device="cuda")
    b = (a * a).sum(dim=1)             # queued on the current stream
    c = b.to("cpu")                    # blocking: waits for the kernels
    assert c.data_ptr() == b.data_ptr()
    assert torch.all(c == 9.0 * 1024)


def test_copy_true_and_set_move_on_copy_false_copy(uvm):
    x = torch.randn(1000)
    assert x.to("cuda", copy=True).data_ptr() != x.data_ptr()
    uvm.set_move_on_copy(False)
    try:
        y = x.to("cuda")
        assert y.data_ptr() != x.data_ptr() and torch.equal(y.cpu(), x)
        assert y.is_managed()
        assert x.uvm_to("cuda").data_ptr() == x.data_ptr()   # explicit zero-copy
    finally:
        uvm.set_move_on_copy(True)


def test_a_copy_to_the_cpu_asked_for_is_a_copy_at_the_links_speed(uvm):
    """`.to("cpu")` moves (the same memory); `copy=True` copies, and a
    non-blocking copy lands in pinned memory, as PyTorch's does: the way to
    get GPU-written data to the CPU at the link's speed (docs/moves.md)."""
    y = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 3   # written on the GPU
    want = torch.arange(1 << 20, dtype=torch.float32) * 3
    torch.cuda._sleep(50_000_000)   # the write below lands late, unless loading add_'s
    y.add_(1)                       # kernel holds the host: ordering is not what this checks
    z = y.to("cpu", copy=True, non_blocking=True)
    torch.cuda.synchronize()
    assert z.device.type == "cpu" and z.data_ptr() != y.data_ptr()
    assert z.is_pinned() and not z.is_managed()
    assert torch.equal(z, want + 1)
    w = y.to("cpu", copy=True)                    # blocking: managed, like any CPU tensor
    assert w.data_ptr() != y.data_ptr() and w.is_managed() and torch.equal(w, want + 1)
    assert y.to("cpu").data_ptr() == y.data_ptr()  # without copy=True: a move


def test_views_slices_and_non_contiguous_keep_offset_and_strides(uvm):
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    view = base[1:, ::2, 1:4].transpose(0, 2)
    moved = view.to("cuda")
    assert moved.data_ptr() == view.data_ptr()
    assert moved.stride() == view.stride() and moved.storage_offset() == view.storage_offset()
    assert torch.equal(moved.cpu(), view)
    assert torch.equal((moved + 1).cpu(), view + 1)
    moved.zero_()
    torch.cuda.synchronize()
    assert base[1:, ::2, 1:4].abs().sum() == 0 and base[0].abs().sum() > 0


def test_memory_format_change_copies(uvm):
    x = torch.randn(2, 3, 4, 5)
    y = x.to("cuda", memory_format=torch.channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert y.data_ptr() != x.data_ptr() and torch.equal(y.cpu(), x)


def test_allocation_outlives_either_side_of_a_move(uvm):
    x = torch.randn(1 << 16)
    expected = x.clone()
    y = x.to("cuda")
    del x
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), expected)
    z = torch.randn(1 << 16, device="cuda")
    expected = z.clone().cpu().clone()
    w = z.to("cpu")
    assert w.data_ptr() == z.data_ptr()
    del z
    # Were the block freed with z, these would take it and overwrite w.
    junk = [torch.full((1 << 16,), 7.0, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    assert torch.equal(w, expected)
    del junk


def test_autograd_through_moves(uvm):
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, 16, device="cuda", requires_grad=True)
    loss = (x.to("cuda") @ w).relu().sum()
    loss.backward()
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = w.detach().cpu().clone().requires_grad_(True)
    (x_ref @ w_ref).relu().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad.cpu(), w_ref.grad)
    assert x.grad.device.type == "cpu"


def test_save_load_and_pickle(uvm, tmp_path):
    x = torch.randn(100, device="cuda")
    y = torch.randn(10, 10)
    path = tmp_path / "t.pt"
    torch.save({"x": x, "y": y}, path)
    loaded = torch.load(path)
    assert torch.equal(loaded["x"], x) and loaded["x"].is_cuda and loaded["x"].is_managed()
    assert torch.equal(loaded["y"], y)
    buf = io.BytesIO()
    torch.save(x.to("cpu"), buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf), x.cpu())
    assert torch.equal(pickle.loads(pickle.dumps(y)), y)


def test_prefetch_and_advise(uvm):
    # Advice and prefetches are read back from the driver: a data comparison
    # cannot fail, since neither changes data.
    x = torch.randn(4 << 20)  # 16 MiB: the prefetch goes through the worker
    uvm.advise(x, "read_mostly")
    assert range_attribute(x, READ_MOSTLY) == 1
    uvm.advise(x, "unset_read_mostly")
    assert range_attribute(x, READ_MOSTLY) == 0
    uvm.prefetch(x, "cuda")
    torch.cuda.current_stream().synchronize()  # waits for the worker's prefetch
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == 0
    uvm.prefetch(x, "cpu")
    torch.cuda.current_stream().synchronize()
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == -1
    s = torch.cuda.Stream()
    uvm.prefetch(x, "cuda:0", stream=s)
    s.synchronize()
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == 0
    uvm.advise(x, "preferred_location", "cpu")
    assert range_attribute(x, PREFERRED_LOCATION) == -1
    uvm.advise(x, "preferred_location", "cuda")
    assert range_attribute(x, PREFERRED_LOCATION) == 0
    uvm.advise(x, "accessed_by", "cuda")
    torch.cuda.synchronize()


@pytest.mark.parametrize("call, exc, match", [
    (lambda uvm: uvm.advise(torch.ones(4), "fast"), ValueError, "unknown advice 'fast'"),
    (lambda uvm: uvm.advise(torch.ones(4), "accessed_by", "cpu"), ValueError, "cuda device"),
    (lambda uvm: uvm.prefetch(torch.ones(4), "cuda:64"), IndexError, "does not exist"),
    (lambda uvm: uvm.prefetch(torch.ones(4).unmanage_memory()), ValueError, "not managed"),
    (lambda uvm: torch.ones(4).to("cuda:64"), Exception, "cuda:64|invalid device|out of range"),
    (lambda uvm: uvm.set_enabled_uvm(False), RuntimeError, "cannot be turned off"),
])
def test_bad_input_on_gpu(uvm, call, exc, match):
    with pytest.raises(exc, match=match):
        call(uvm)


def test_enabling_twice_is_a_no_op(uvm):
    uvm.set_enabled_uvm(True)
    assert uvm.get_enabled_uvm()


def test_stats_snapshot_and_empty_cache(uvm):
    uvm.empty_cache()
    before = uvm.memory_stats()
    x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    stats = uvm.memory_stats()
    assert stats["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] >= 3 << 20
    assert any(s["device"] == 0 for s in uvm.memory_snapshot())
    del x
    uvm.empty_cache()
    assert uvm.memory_stats()["reserved_bytes.all.current"] <= before["reserved_bytes.all.current"] + (20 << 20)
    uvm._C.check_invariants()
    assert "Reserved memory" in uvm.memory_summary()


def test_cache_reuses_blocks(uvm):
    torch.cuda.synchronize()
    x = torch.empty(1 << 20, device="cuda")
    ptr = x.data_ptr()
    del x
    before = uvm.memory_stats()["num_device_alloc"]
    y = torch.empty(1 << 20, device="cuda")
    assert y.data_ptr() == ptr
    assert uvm.memory_stats()["num_device_alloc"] == before


@multigpu
def test_cuda0_to_cuda1_moves(uvm):
    x = torch.randn(1 << 20, device="cuda:0")
    y = x.to("cuda:1")
    assert y.device == torch.device("cuda", 1) and y.data_ptr() == x.data_ptr()
    with torch.cuda.device(1):
        torch.cuda._sleep(100_000_000)   # cuda:1 is slow to produce z
        z = y * 2
    w = z.to("cuda:0")                   # zero-copy: cuda:0 must wait for cuda:1
    assert w.data_ptr() == z.data_ptr()
    assert torch.equal(w, x * 2)
