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
    dst.copy_(x)
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == 0
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
    # As from pageable memory: the caller may write the source at once.
    for _ in range(3):
        x = on_host()
        dst = torch.empty(N, device="cuda")
        dst.copy_(x)
        x.fill_(-1.0)
        assert torch.equal(dst.cpu(), torch.arange(N, dtype=torch.float32))


def test_dtype_changing_to_prefetches_and_converts_on_the_gpu(uvm, on_host):
    x = on_host()
    y = x.to("cuda", torch.float16)
    assert y.is_cuda and y.dtype == torch.float16 and y.data_ptr() != x.data_ptr()
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == 0
    assert torch.equal(y.cpu(), x.to(torch.float16))


def test_non_contiguous_source_and_destination(uvm, on_host):
    x = on_host().view(1024, -1)[:, ::2]
    dst = torch.empty(x.shape[1], 1024, device="cuda").t()
    dst.copy_(x)
    assert torch.equal(dst.cpu(), x)


def test_load_state_dict_from_managed_cpu_tensors(uvm, on_host):
    model = torch.nn.Linear(1024, 2048).cuda()
    state = {k: on_host(v.numel()).view_as(v) / 1e6 for k, v in model.state_dict().items()}
    for v in state.values():
        uvm.prefetch(v, "cpu")
    torch.cuda.synchronize()
    model.load_state_dict(state)
    for k, v in model.state_dict().items():
        assert range_attribute(state[k], LAST_PREFETCH_LOCATION) == 0, k
        assert torch.equal(v.cpu(), state[k]), k


def test_autograd_flows_back_through_the_copy(uvm):
    src = torch.randn(1000, requires_grad=True)
    dst = torch.zeros(1000, device="cuda")
    dst.copy_(src)
    (dst * 3).sum().backward()
    assert src.grad is not None and src.grad.device.type == "cpu"
    assert torch.equal(src.grad, torch.full((1000,), 3.0))


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
    dst.copy_(src)
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
