"""The fast copy paths (csrc/torch/copy_kernels.cpp): copies from managed CPU
tensors into GPU tensors prefetch their source; large copies into managed CPU
tensors go through pinned buffers. Skipped without a GPU; UVM is on.

A data check cannot tell a prefetch happened: these read where the runtime
last prefetched the source's pages, and count the pinned allocator's
hand-outs."""
import pytest
import torch

from conftest import LAST_PREFETCH_LOCATION, gpu, range_attribute

pytestmark = gpu

CPU_ID = -1          # cudaCpuDeviceId
N = 4 << 20          # 16 MiB of float32


@pytest.fixture
def on_host(uvm):
    """A managed CPU tensor whose pages were last prefetched to the CPU."""
    def make(n=N, dtype=torch.float32):
        x = torch.arange(n, dtype=dtype)
        uvm.prefetch(x, "cpu")
        torch.cuda.synchronize()
        assert range_attribute(x, LAST_PREFETCH_LOCATION) == CPU_ID
        return x
    return make


def test_copy_to_gpu_prefetches_the_managed_source(uvm, on_host):
    x = on_host()
    dst = torch.empty(N, device="cuda")
    with uvm.expect_no_gpu_faults(x):     # the copy reads prefetched pages
        dst.copy_(x)
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == torch.cuda.current_device()
    assert torch.equal(dst.cpu(), torch.arange(N, dtype=torch.float32))


def test_with_fast_copy_off_the_copy_is_pytorchs(uvm, on_host):
    x = on_host()
    dst = torch.empty(N, device="cuda")
    uvm.set_fast_copy(False)
    try:
        assert not uvm.get_fast_copy()
        dst.copy_(x)
    finally:
        uvm.set_fast_copy(True)
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == CPU_ID
    assert torch.equal(dst.cpu(), x)


def test_a_blocking_copy_is_done_when_it_returns(uvm, on_host):
    # As from pageable memory: the caller may write the source at once. The
    # stream is kept busy first, so a copy still queued would see the write.
    for _ in range(3):
        x = on_host()
        dst = torch.empty(N, device="cuda")
        torch.cuda._sleep(100_000_000)
        dst.copy_(x)
        x.fill_(-1.0)
        assert torch.equal(dst.cpu(), torch.arange(N, dtype=torch.float32))


def test_dtype_changing_to_prefetches_and_converts_on_the_gpu(uvm, on_host):
    x = on_host()
    y = x.to("cuda", torch.float16)
    assert y.is_cuda and y.dtype == torch.float16 and y.data_ptr() != x.data_ptr()
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == torch.cuda.current_device()
    assert torch.equal(y.cpu(), x.to(torch.float16))


def test_non_contiguous_source_and_destination(uvm, on_host):
    x = on_host().view(1024, -1)[:, ::2]
    dst = torch.empty(x.shape[1], 1024, device="cuda").t()
    dst.copy_(x)
    assert torch.equal(dst.cpu(), x)


def test_load_state_dict_from_managed_cpu_tensors(uvm, on_host):
    model = torch.nn.Linear(1024, 2048).cuda()    # an 8 MiB weight, an 8 KiB bias
    state = {k: on_host(v.numel()).view_as(v) / 1e6 for k, v in model.state_dict().items()}
    for v in state.values():
        uvm.prefetch(v, "cpu")
    torch.cuda.synchronize()
    model.load_state_dict(state)
    # the weight is prefetched; the bias, below 4 MiB, is PyTorch's copy
    assert range_attribute(state["weight"], LAST_PREFETCH_LOCATION) == torch.cuda.current_device()
    assert range_attribute(state["bias"], LAST_PREFETCH_LOCATION) == CPU_ID
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), state[k]), k


def test_copies_over_memory_the_destination_shares_are_pytorchs(uvm):
    # A GPU tensor and a transposed CPU view of the same memory: the fast
    # path would permute in place on the GPU, racing with itself.
    g = torch.arange(N, dtype=torch.float32, device="cuda").view(64, -1)
    src = g.view(-1, 64).cpu().t()                # same memory, seen on the CPU
    assert src.data_ptr() == g.data_ptr()
    want = src.clone()
    g.copy_(src)
    assert torch.equal(g.cpu(), want)


def test_a_moved_cpu_tensor_is_a_destination_like_any_other(uvm, on_host):
    # A model built on the CPU, then .cuda(): its weights are CPU-homed
    x = on_host()
    home = torch.zeros(N)
    g = home.cuda()                               # the same memory, CPU-homed
    g.copy_(x)
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == torch.cuda.current_device()
    assert torch.equal(home, x)


@pytest.mark.parametrize("budget", ["limit", "share"])
def test_under_a_budget_a_cpu_homed_destination_is_not_prefetched_into(uvm, on_host, budget):
    # An offloaded weight streams under a budget (the GPU's limit, or an
    # offload's own share): the source must not come to the GPU outside it
    x = on_host()
    home = torch.zeros(N)
    g = home.cuda()
    budgets = uvm._C.residency_budget()
    gpu = torch.cuda.current_device()
    if budget == "limit":
        uvm.set_residency_limit(64 << 20)
    else:
        share = budgets.open_share(gpu, 64 << 20, "a test", uvm.get_memory_cap())
    try:
        g.copy_(x)
    finally:
        if budget == "limit":
            uvm.set_residency_limit(None)
        else:
            budgets.close_share(share)
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == CPU_ID
    assert torch.equal(home, x)


def test_autograd_flows_back_through_the_copy(uvm):
    src = torch.randn(N, requires_grad=True)
    dst = torch.zeros(N, device="cuda")
    dst.copy_(src)
    assert range_attribute(src, LAST_PREFETCH_LOCATION) == torch.cuda.current_device()    # the fast path
    (dst * 3).sum().backward()
    assert src.grad is not None and src.grad.device.type == "cpu"
    assert torch.equal(src.grad, torch.full((N,), 3.0))


def test_unmanaged_source_copies_as_pytorch_does(uvm):
    x = torch.arange(1000.0).unmanage_memory()
    dst = torch.empty(1000, device="cuda")
    dst.copy_(x)
    assert torch.equal(dst.cpu(), x)


def pinned_handouts():
    stats = torch.cuda.host_memory_stats()
    if "active_requests.allocated" not in stats:
        pytest.skip("this torch has no pinned-allocator statistics")
    return stats["active_requests.allocated"]


def test_copy_to_managed_cpu_goes_through_pinned_buffers(uvm):
    n = (56 << 20) // 4                          # 3.5 pieces of 16 MiB
    base = torch.arange(n, dtype=torch.float32, device="cuda")
    torch.cuda._sleep(100_000_000)               # the stream busy: the copy must wait
    src = base * 3                               # queued just before the copy
    dst = torch.empty(n)
    assert dst.is_managed()
    before = pinned_handouts()
    dst.copy_(src)
    assert pinned_handouts() >= before + 2       # two buffers, reused
    assert torch.equal(dst, torch.arange(n, dtype=torch.float32) * 3)


def test_staged_copies_of_non_contiguous_and_odd_sizes(uvm):
    src = torch.arange((2048 + 3) * 4096, dtype=torch.float64,
                       device="cuda").view(2048 + 3, 4096).t()
    dst = torch.empty(src.shape, dtype=torch.float64)
    before = pinned_handouts()
    dst.copy_(src)
    assert pinned_handouts() >= before + 2
    assert torch.equal(dst, src.cpu())


def test_small_and_unmanaged_copies_to_cpu_are_pytorchs(uvm):
    before = pinned_handouts()
    small = torch.empty(1000)
    small.copy_(torch.ones(1000, device="cuda"))           # below 4 MiB
    plain = torch.empty(2 << 20).unmanage_memory()
    plain.copy_(torch.ones(2 << 20, device="cuda"))
    assert pinned_handouts() == before
    assert torch.equal(small, torch.ones(1000))
    assert torch.equal(plain, torch.ones(2 << 20))


def test_broadcast_copy_to_cpu(uvm):
    # PyTorch expands the source on the GPU, then copies element for element
    # (which may be staged)
    wide = torch.empty(8, 1 << 20)
    wide.copy_(torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
    assert all(torch.equal(row, torch.arange(1 << 20, dtype=torch.float32)) for row in wide)


def test_with_fast_copy_off_copies_to_cpu_are_pytorchs(uvm):
    src = torch.ones(8 << 20, device="cuda")
    dst = torch.empty(8 << 20)
    before = pinned_handouts()
    uvm.set_fast_copy(False)
    try:
        dst.copy_(src)
    finally:
        uvm.set_fast_copy(True)
    assert pinned_handouts() == before
    assert torch.equal(dst, torch.ones(8 << 20))
