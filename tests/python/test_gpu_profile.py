"""The driver's counters in torch_uvm.profile (issue 22): migrations and
faults, named by the tensor they hit, checked against what the residency
accounting says moved. A prefetch never changes data: these counters are how
a test sees that one happened (or was missing)."""
import pytest
import torch

from conftest import gpu

pytestmark = gpu
MiB = 1 << 20


@pytest.fixture
def on_host(uvm):
    """A 32 MiB managed tensor made on the GPU (so kernels read it as a CUDA
    tensor) whose pages were then prefetched to the CPU."""
    def make():
        x = torch.ones(8 * MiB, device="cuda")
        uvm.prefetch(x, "cpu")
        torch.cuda.synchronize()
        return x
    return make


def test_a_prefetched_tensor_is_read_without_faults_and_the_prefetch_is_counted(uvm, on_host):
    x = on_host()
    with uvm.profile(names={"x": x}) as p:
        uvm.prefetch(x, "cuda")
        x.sum()
        torch.cuda.synchronize()
    assert p.counters_missing is None
    moved = p.moved(x)
    assert moved["gpu_faults"] == 0
    assert moved["prefetched"] == moved["to_gpu"] == x.nbytes
    assert moved["to_host"] == 0
    totals = p.driver_totals()
    assert totals["x"]["prefetched_bytes"] == x.nbytes
    assert "What the driver moved" in p.summary() and "| x | 32.0 | 32.0 |" in p.summary()


def test_the_same_read_without_the_prefetch_faults(uvm, on_host):
    x = on_host()
    with uvm.profile(names={"x": x}) as p:
        x.sum()
        torch.cuda.synchronize()
    moved = p.moved(x)
    assert moved["gpu_faults"] > 0
    assert moved["prefetched"] == 0 and moved["to_gpu"] > 0   # the faults brought the pages
    faulted = [e for e in p.driver_events() if e["kind"] == "gpu_fault"]
    assert faulted and {n for e in faulted for n, _ in e["pieces"]} == {"x"}


def test_expect_no_gpu_faults_passes_a_prefetched_read_and_fails_a_missing_prefetch(uvm, on_host):
    x = on_host()
    with uvm.expect_no_gpu_faults(x):
        uvm.prefetch(x, "cuda")
        x.sum()
    uvm.prefetch(x, "cpu")
    torch.cuda.synchronize()
    with pytest.raises(AssertionError, match="a prefetch is missing"):
        with uvm.expect_no_gpu_faults(x):
            x.sum()


def test_a_move_to_the_gpu_is_read_without_faults(uvm):
    """.to('cuda') of a managed CPU tensor is the same memory, advised and
    prefetched: the kernels after it never fault on it, whatever the size
    (inline or off-thread prefetch)."""
    for n in (1 * MiB, 16 * MiB):           # 4 MiB and 64 MiB: both prefetch paths
        x = torch.arange(n, dtype=torch.float32)
        uvm.prefetch(x, "cpu")
        torch.cuda.synchronize()
        with uvm.expect_no_gpu_faults(x) as p:
            y = x.to("cuda", non_blocking=True)
            (y * 2).sum()
        assert p.moved(x)["prefetched"] == x.nbytes


def test_the_accounting_of_streamed_batches_matches_what_the_driver_moved(uvm):
    """Every batch the residency policy says arrived, the driver prefetched
    (byte for byte); every batch it let go as a clean copy left without the
    driver moving a byte home (a read-mostly duplicate dropped)."""
    uvm.set_residency_limit(64 * MiB)
    try:
        data = torch.arange(32 * MiB, dtype=torch.float32)      # 128 MiB, managed, on the CPU
        uvm.prefetch(data, "cpu")
        torch.cuda.synchronize()
        batches = list(data.split(4 * MiB))                     # 16 MiB each
        with uvm.profile(names={f"batch {i}": b for i, b in enumerate(batches)}) as p:
            for batch in uvm.prefetching(batches, "cuda", ahead=2):
                batch.sum()
        arrived = sum(e["bytes"] for e in p.timeline() if e["kind"] == "arrive")
        dropped = sum(e["bytes"] for e in p.timeline() if e["kind"] == "drop")
        written = sum(e["bytes"] for e in p.timeline() if e["kind"] == "write_home")
        assert arrived == data.nbytes and dropped > 0 and written == 0
        driver = p.driver_totals()
        for i, b in enumerate(batches):
            assert driver[f"batch {i}"]["prefetched_bytes"] == b.nbytes, i
            assert driver[f"batch {i}"]["to_host_bytes"] == 0, i
        assert p.gpu_faults(data) == 0
        assert p.peaks()["cuda:0"] <= 64 * MiB
    finally:
        uvm.evict()
        uvm.set_residency_limit(None)


def test_counters_are_not_taken_from_a_running_torch_profiler(uvm, on_host):
    x = on_host()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with pytest.warns(UserWarning, match="torch.profiler is recording"):
            with uvm.profile() as p:
                x.sum()
    assert "torch.profiler" in p.counters_missing
    with pytest.raises(RuntimeError, match="not recorded"):
        p.moved(x)
    names = [e.name for e in prof.events()]                    # kineto kept its trace:
    assert "aten::sum" in names and any("reduce" in n.lower() for n in names)   # op and kernel
    uvm.prefetch(x, "cpu")                  # the faults above brought x to the GPU
    torch.cuda.synchronize()
    with uvm.profile() as after:                               # and ours work after it
        uvm.prefetch(x, "cuda")
        torch.cuda.synchronize()
    assert after.counters_missing is None and after.moved(x)["prefetched"] == x.nbytes


def test_a_trace_and_a_plot_show_the_driver_events(uvm, on_host, tmp_path):
    import json
    x = on_host()
    with uvm.profile(names={"x": x}) as p:
        x.sum()
        torch.cuda.synchronize()
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    driver = [e for e in events if e.get("pid") == "torch_uvm driver (CUPTI)" and e["ph"] != "M"]
    assert any(e["name"].startswith("to_gpu fault x") and e["dur"] >= 0 for e in driver)
    assert any(e["name"] == "gpu_fault x" for e in driver)
    pytest.importorskip("matplotlib")
    p.plot(str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 0


def test_torch_uvms_own_work_is_named_in_a_torch_profiler_trace(uvm, tmp_path):
    """Issue 22, point 1: a prefetch, an advice, a move, a prefetched copy to
    the GPU, a staged copy to the CPU, and the bring and eviction of streamed
    batches each show as a torch_uvm:: range with its bytes and, where it
    queues work, the stream."""
    import json
    from torch.profiler import ProfilerActivity, profile
    x = torch.ones(2 * MiB)                                   # 8 MiB managed CPU tensors
    gpu_dst = torch.empty(2 * MiB, device="cuda")
    host_dst = torch.empty(2 * MiB)
    data = torch.arange(8 * MiB, dtype=torch.float32)          # 32 MiB of batches
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            uvm.advise(x, "preferred_location", "cpu")
            uvm.prefetch(x, "cuda")
            moved = x.to("cuda")
            gpu_dst.copy_(x)                                  # a managed source: prefetched
            host_dst.copy_(gpu_dst)                           # into a managed CPU tensor: staged
            uvm.set_residency_limit(12 * MiB)                 # 3 of the 8 batches: some leave
            for batch in uvm.prefetching(list(data.split(1 * MiB)), "cuda"):
                batch.sum()
            torch.cuda.synchronize()
    finally:
        uvm.evict()
        uvm.set_residency_limit(None)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    ours = [e for e in json.loads(path.read_text())["traceEvents"]
            if e.get("name", "").startswith("torch_uvm::")]
    by_name = {}
    for e in ours:
        by_name.setdefault(e["name"], []).append(e)
    stream = torch.cuda.current_stream().cuda_stream
    expect = {"torch_uvm::advise preferred_location cpu": x.nbytes,
              "torch_uvm::prefetch to cuda:0": x.nbytes,
              "torch_uvm::move cpu to cuda:0": x.nbytes,
              "torch_uvm::prefetched_copy to cuda:0": x.nbytes,
              "torch_uvm::staged_copy cuda:0 to cpu": x.nbytes}
    for name, nbytes in expect.items():                      # (batches move and are advised too)
        assert name in by_name, (name, sorted(by_name))
        assert any(e["args"]["bytes"] == nbytes for e in by_name[name]), by_name[name]
    for name in ("torch_uvm::move cpu to cuda:0", "torch_uvm::prefetched_copy to cuda:0",
                 "torch_uvm::staged_copy cuda:0 to cpu"):
        assert {e["args"]["cuda_stream"] for e in by_name[name]} == {stream}, by_name[name]
    brought = [n for n in by_name if n.startswith("torch_uvm::bring ")]
    left = [n for n in by_name if n.startswith(("torch_uvm::drop ", "torch_uvm::write_home "))]
    assert brought == [f"torch_uvm::bring {4 * MiB} bytes"], sorted(by_name)
    assert len(by_name[brought[0]]) == 8 and left, sorted(by_name)
    assert moved.data_ptr() == x.data_ptr()
