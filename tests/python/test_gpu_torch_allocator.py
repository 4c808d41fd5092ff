"""torch_uvm as PyTorch's CUDA allocator in full (issue 9): the torch.cuda
memory API per device, snapshots and history, private pools for CUDA graphs,
make_graphed_callables, torch.compile(mode="reduce-overhead"), cuDNN's
benchmark mode, memory fractions, aliases autograd can see, resize_ and out=
on moved tensors, the refusal of CUDA IPC, and CUDA contexts only where used.
Skipped without a GPU."""
import gc
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import GPU_COUNT, ROOT, gpu, multigpu, run_python, run_script

pytestmark = gpu
MiB = 1 << 20


def _fresh(uvm):
    # Earlier tests' tensors held by reference cycles (offload handles, hooks,
    # tracebacks) would keep their segments: collect them first.
    gc.collect()
    torch.cuda.synchronize()
    uvm.empty_cache()


# ---- the memory API, per device --------------------------------------------

def test_memory_api_counts_known_allocations(uvm):
    _fresh(uvm)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() == before + 3 * MiB
    assert torch.cuda.max_memory_allocated() >= before + 3 * MiB
    assert torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.current"] == before + 3 * MiB
    assert stats["requested_bytes.large_pool.current"] >= 3 * MiB
    for key in ("active_bytes.all.peak", "reserved_bytes.small_pool.allocated",
                "inactive_split_bytes.all.current", "num_alloc_retries", "num_ooms",
                "num_device_alloc", "num_device_free", "oversize_allocations.current",
                "segment.all.current"):
        assert key in stats, key
    del x
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.max_memory_allocated() >= before + 3 * MiB
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == before
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    assert "Allocated memory" in torch.cuda.memory_summary()


def test_cpu_tensors_count_in_torch_uvm_stats_not_in_torch_cuda(uvm):
    _fresh(uvm)
    gpu_before = torch.cuda.memory_allocated()
    all_before = uvm.memory_stats()["allocated_bytes.all.current"]
    c = torch.empty(5 * MiB, dtype=torch.uint8)  # managed, CPU home
    assert uvm.is_managed(c)
    assert torch.cuda.memory_allocated() == gpu_before
    assert uvm.memory_stats()["allocated_bytes.all.current"] == all_before + 5 * MiB
    del c


def test_torch_accelerator_sees_the_same_allocator(uvm):
    if not hasattr(torch, "accelerator") or not hasattr(torch.accelerator, "memory_allocated"):
        pytest.skip("torch.accelerator.memory_allocated is not in this torch")
    x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == \
        torch.cuda.memory_allocated()
    del x


def test_allocator_backend_is_torch_uvm(uvm):
    assert torch.cuda.get_allocator_backend() == "torch_uvm"


@multigpu
def test_statistics_are_per_device(uvm):
    _fresh(uvm)
    a0, a1 = torch.cuda.memory_allocated(0), torch.cuda.memory_allocated(1)
    y = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda:1")
    assert torch.cuda.memory_allocated(1) == a1 + 2 * MiB
    assert torch.cuda.memory_allocated(0) == a0
    torch.cuda.reset_peak_memory_stats(0)
    assert torch.cuda.max_memory_allocated(1) >= a1 + 2 * MiB
    del y


# ---- snapshots and history ---------------------------------------------------

def test_snapshot_and_history_in_pytorchs_format(uvm, tmp_path):
    from torch.cuda import _memory_viz
    _fresh(uvm)
    # Python stacks only: symbolizing C++ frames takes minutes.
    torch.cuda.memory._record_memory_history(max_entries=10000, stacks="python")
    try:
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        y = torch.empty(1000, device="cuda")
        del y
        # larger than any segment earlier tests may have left: a new one
        z = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        snap = torch.cuda.memory._snapshot()
        path = tmp_path / "snap.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    blocks = {}
    for seg in snap["segments"]:
        # (other GPUs' segments too, where earlier tests used them)
        assert seg["device"] in range(torch.cuda.device_count())
        assert seg["segment_type"] in ("small", "large")
        addr = seg["address"]
        for b in seg["blocks"]:
            blocks[addr] = (b, seg)
            addr += b["size"]
        assert addr == seg["address"] + seg["total_size"]
    block, seg = blocks[x.data_ptr()]
    assert block["state"] == "active_allocated" and block["size"] == 3 * MiB
    assert block["frames"], "no stack recorded for a live block"
    assert any("test_snapshot_and_history" in f["name"] for f in block["frames"])
    trace = snap["device_traces"][0]
    actions = [(e["action"], e["addr"]) for e in trace]
    assert ("alloc", x.data_ptr()) in actions
    assert any(a == "free_requested" for a, _ in actions)
    assert ("segment_alloc", z.data_ptr()) in actions
    # The pickle loads back with the same segments, and PyTorch's own
    # visualizer code reads it.
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert [s["address"] for s in loaded["segments"]] == [s["address"] for s in snap["segments"]]
    assert _memory_viz.segsum(loaded)
    assert _memory_viz.trace(loaded)
    assert "<html" in _memory_viz.trace_plot(loaded).lower()
    assert torch.cuda.memory_snapshot()  # the segments alone
    del x


def test_history_off_records_nothing_more(uvm):
    torch.cuda.memory._record_memory_history(max_entries=100, stacks="python")
    torch.cuda.memory._record_memory_history(enabled=None)
    z = torch.empty(MiB, device="cuda")
    traces = torch.cuda.memory._snapshot()["device_traces"]
    assert not any(e["addr"] == z.data_ptr() for t in traces for e in t)
    del z


def test_out_of_memory_observer_is_called(uvm):
    _fresh(uvm)
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
    old = uvm.get_memory_cap()
    uvm.set_memory_cap(uvm.memory_stats()["reserved_bytes.all.current"] + 64 * MiB)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    finally:
        uvm.set_memory_cap(old)
    assert seen and seen[-1][0] == 0


# ---- CUDA graphs ---------------------------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 256)).cuda()


def test_graph_with_temporaries_replays_with_new_inputs(uvm):
    model = _mlp()
    static_in = torch.randn(64, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_out = model(static_in)  # temporaries in the graph's private pool
    segs = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) != (0, 0)]
    assert segs, "the capture made no private-pool segment"
    for i in range(3):
        new = torch.randn(64, 256, device="cuda")
        static_in.copy_(new)
        junk = torch.randn(1 << 18, device="cuda")  # ordinary allocations between replays
        g.replay()
        with torch.no_grad():
            torch.testing.assert_close(static_out, model(new), rtol=1e-4, atol=1e-4)
        del junk
    # A second graph in the same pool, replayed after the first.
    g2 = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g2, pool=g.pool()):
        static_out2 = model(static_out) * 2
    new = torch.randn(64, 256, device="cuda")
    static_in.copy_(new)
    g.replay()
    g2.replay()
    with torch.no_grad():
        torch.testing.assert_close(static_out2, model(model(new)) * 2, rtol=1e-4, atol=1e-4)
    del g, g2
    torch.cuda.synchronize()
    uvm.empty_cache()
    uvm._C.check_invariants()


def test_graph_of_a_training_step(uvm):
    model = _mlp()
    reference = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    static_x = torch.randn(32, 256, device="cuda")
    static_y = torch.randn(32, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up steps, repeated on the reference
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        ref_opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(reference(static_x), static_y).backward()
        ref_opt.step()
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = torch.nn.functional.mse_loss(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    for _ in range(4):
        x, y = torch.randn(32, 256, device="cuda"), torch.randn(32, 256, device="cuda")
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = torch.nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        torch.testing.assert_close(static_loss, ref_loss)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_make_graphed_callables_forward_and_backward(uvm):
    model = _mlp()
    reference = _mlp()
    sample = torch.randn(16, 256, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    for _ in range(3):
        x = torch.randn(16, 256, device="cuda", requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        out = graphed(x)
        out.sum().backward()
        ref = reference(x_ref)
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(x.grad, x_ref.grad)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None


def test_mempool_routes_allocations_to_its_pool(uvm):
    if not hasattr(torch.cuda, "MemPool"):
        pytest.skip("torch.cuda.MemPool is not in this torch")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    assert pool.use_count() >= 1
    segs = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pool.id]
    assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segs)
    del t
    with pytest.raises(NotImplementedError, match="use_on_oom"):
        torch.cuda.MemPool(use_on_oom=True)


def test_a_mempool_with_an_allocator_of_its_own_is_refused(uvm):
    if not hasattr(torch.cuda, "MemPool"):
        pytest.skip("torch.cuda.MemPool is not in this torch")
    import ctypes.util
    from torch.cuda.memory import CUDAPluggableAllocator
    # Any two functions of a library stand in for its alloc and free: the pool
    # is refused before anything could call them.
    own = CUDAPluggableAllocator(ctypes.util.find_library("c") or "libc.so.6", "malloc", "free")
    with pytest.raises(ValueError, match="a torch.cuda.MemPool with its own allocator cannot be "
                                         "used with UVM on: every CUDA allocation comes from "
                                         "torch_uvm's managed memory"):
        torch.cuda.MemPool(own.allocator())
    pool = torch.cuda.MemPool(None)                   # without one: torch_uvm's, and it works
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    assert uvm.is_managed(t) and pool.use_count() >= 1
    segs = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pool.id]
    assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segs)
    del t


# ---- torch.compile(mode="reduce-overhead") -----------------------------------

class _Block(torch.nn.Module):
    def __init__(self, d=128, heads=4):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                      torch.nn.Linear(4 * d, d))
        self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)

    def forward(self, x):
        x = x + self.attn(self.n1(x), self.n1(x), self.n1(x), need_weights=False)[0]
        return x + self.ff(self.n2(x))


def _compile_and_compare(model, shapes, train):
    """Runs the compiled model on each shape in turn (a new shape records a
    new graph), comparing with eager; returns how often graph trees restored
    a pool checkpoint."""
    import torch._inductor.cudagraph_trees as trees
    restores = []
    real = torch._C._cuda_setCheckpointPoolState

    def counting(*args):
        restores.append(1)
        return real(*args)

    torch._C._cuda_setCheckpointPoolState = counting
    try:
        compiled = torch.compile(model, mode="reduce-overhead")
        for shape in shapes:
            for _ in range(3):
                x = torch.randn(*shape, device="cuda")
                if train:
                    out = compiled(x)
                    out.sum().backward()
                    grads = [p.grad.clone() for p in model.parameters()]
                    model.zero_grad(set_to_none=True)
                    ref = model(x)
                    ref.sum().backward()
                    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
                    for g, p in zip(grads, model.parameters()):
                        torch.testing.assert_close(g, p.grad, rtol=2e-3, atol=2e-3)
                    model.zero_grad(set_to_none=True)
                else:
                    with torch.no_grad():
                        out = compiled(x).clone()
                        torch.testing.assert_close(out, model(x), rtol=2e-3, atol=2e-3)
    finally:
        torch._C._cuda_setCheckpointPoolState = real
    assert trees.get_container(0).tree_manager is not None, "no CUDA graph tree was built"
    return len(restores)


@pytest.mark.timeout(600)
def test_compile_reduce_overhead_mlp_inference_and_training(uvm):
    torch._dynamo.reset()
    model = _mlp()
    _compile_and_compare(model, [(64, 256), (48, 256), (64, 256)], train=False)
    torch._dynamo.reset()
    restores = _compile_and_compare(model, [(64, 256), (48, 256), (64, 256)], train=True)
    print("pool checkpoint restores:", restores)
    assert torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0) == 0


@pytest.mark.timeout(600)
def test_compile_reduce_overhead_transformer(uvm):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(), _Block()).cuda()
    _compile_and_compare(model, [(4, 32, 128), (4, 48, 128)], train=True)


# ---- cuDNN benchmark mode ----------------------------------------------------

def test_cudnn_benchmark_on_a_conv_net(uvm):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 32, 3, padding=1)).cuda()
    x = torch.randn(8, 3, 64, 64, device="cuda")
    torch.backends.cudnn.benchmark = False
    expected = net(x)
    torch.backends.cudnn.benchmark = True
    try:
        out = net(x)
        out.sum().backward()
    finally:
        torch.backends.cudnn.benchmark = False
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)  # TF32 algorithms differ
    largest = torch.cuda.memory_stats()["reserved_bytes.all.current"]
    assert largest <= uvm.get_memory_cap()


# ---- memory fraction -----------------------------------------------------------

def test_memory_fraction_as_pytorch_defines_it(uvm):
    _fresh(uvm)
    torch.cuda.set_per_process_memory_fraction(1.0)
    assert torch.cuda.get_per_process_memory_fraction() == 1.0
    total = torch.cuda.get_device_properties(0).total_memory
    reserved = torch.cuda.memory_reserved(0)
    fraction = (reserved + 64 * MiB) / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        with pytest.raises(torch.OutOfMemoryError, match="memory fraction"):
            torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        ok = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
        del ok
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    big = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del big
    with pytest.raises(ValueError):
        torch.cuda.set_per_process_memory_fraction(1.5)


# ---- aliases autograd and resize_ can see ---------------------------------------

def test_inplace_on_a_moved_alias_is_caught_by_autograd(uvm):
    x = torch.ones(4, requires_grad=True)
    assert uvm.is_managed(x)
    s = (x * x).sum()
    y = x.to("cuda")
    assert y.data_ptr() == x.data_ptr()
    with torch.no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.backward()
    # The issue's own example, without no_grad: the alias is a non-leaf.
    x = torch.ones(4, requires_grad=True)
    s = (x * x).sum()
    x.to("cuda").add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.backward()


def test_version_counter_is_shared_both_ways(uvm):
    a = torch.zeros(8)
    b = a.to("cuda")
    v = a._version
    b.add_(1)
    assert a._version == v + 1
    torch.cuda.synchronize()
    a.mul_(2)
    assert b._version == a._version
    with torch.inference_mode():
        c = a.to("cuda")  # an inference tensor has no counter to share
        assert c.data_ptr() == a.data_ptr()


def test_resize_of_a_moved_tensor(uvm):
    x = torch.arange(10, dtype=torch.float32)
    y = x.to("cuda")
    y.resize_(5)  # within the storage: still the same memory
    assert y.data_ptr() == x.data_ptr()
    y.resize_(100)  # grows: new managed storage, the first 10 values kept
    assert y.data_ptr() != x.data_ptr()
    assert uvm.is_managed(y)
    assert torch.equal(y[:10].cpu(), torch.arange(10, dtype=torch.float32))
    y.fill_(-1)
    assert torch.equal(x, torch.arange(10, dtype=torch.float32))  # the source is untouched


def test_out_ops_that_resize_a_moved_tensor(uvm):
    a = torch.randn(64, 64, device="cuda")
    b = torch.randn(64, 64, device="cuda")
    out = torch.empty(3).to("cuda")  # a moved alias of the wrong shape
    torch.matmul(a, b, out=out)
    torch.testing.assert_close(out, a @ b)
    same = torch.empty(64, 64).to("cuda")
    ptr = same.data_ptr()
    torch.add(a, b, out=same)  # right shape: written in place, still an alias
    assert same.data_ptr() == ptr
    torch.testing.assert_close(same, a + b)


# ---- CUDA IPC ------------------------------------------------------------------

def test_sharing_a_cuda_tensor_with_another_process_is_a_clear_error():
    r = run_python("""
        import torch, torch_uvm, torch.multiprocessing as mp
        torch_uvm.set_enabled_uvm(True)

        def child(t):
            print('child ran', t.sum().item(), flush=True)

        if __name__ == '__main__':
            t = torch.ones(16, device='cuda')
            ctx = mp.get_context('spawn')
            for how in ('process', 'queue'):
                try:
                    if how == 'process':
                        p = ctx.Process(target=child, args=(t,))
                        p.start()
                        p.join()
                    else:
                        q = ctx.SimpleQueue()
                        q.put(t)
                    print(how, 'shared')
                except RuntimeError as e:
                    print(how, 'error', 'CUDA IPC' in str(e), 'CPU tensor' in str(e))
            print('after', (t * 2).sum().item())
    """, timeout=180)
    assert r.stdout.split("\n")[:3] == ["process error True True", "queue error True True",
                                       "after 32.0"], r.stdout + r.stderr


def test_opening_a_cuda_ipc_handle_with_uvm_on_is_a_clear_error(tmp_path):
    # The other side: a producer with UVM off sends a CUDA tensor (CUDA IPC);
    # a consumer with UVM on cannot open it, and says so when it unpickles it.
    r = run_script(tmp_path / "ipc.py", """
        import torch, torch.multiprocessing as mp

        def consumer(q, out):
            import torch_uvm
            torch_uvm.set_enabled_uvm(True)
            try:
                t = q.get()
                out.put('opened ' + str(t.sum().item()))
            except RuntimeError as e:
                out.put('error ' + str(e).splitlines()[0])
            out.put('after ' + str((torch.ones(4, device='cuda') * 2).sum().item()))

        if __name__ == '__main__':
            ctx = mp.get_context('spawn')
            q, out = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=consumer, args=(q, out))
            p.start()
            t = torch.ones(16, device='cuda')          # UVM off here: device memory
            q.put(t)
            print(out.get(timeout=120))
            print(out.get(timeout=120))
            p.join(60)
            print('exit', p.exitcode)
    """, timeout=240)
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3, r.stdout + r.stderr
    assert lines[0].startswith("error torch_uvm: cannot open a CUDA IPC handle with UVM on"), lines
    assert lines[1:] == ["after 8.0", "exit 0"], r.stdout + r.stderr


# ---- CUDA contexts only where used -------------------------------------------

_PRIMARY_CONTEXT_ACTIVE = """
import ctypes
def primary_context_active(ordinal):
    cuda = ctypes.CDLL('libcuda.so.1')
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
    return bool(active.value)
"""


@multigpu
def test_no_context_on_a_gpu_the_program_never_touches():
    r = run_python(_PRIMARY_CONTEXT_ACTIVE + """
import torch, torch_uvm
torch_uvm.set_enabled_uvm(True)
x = torch.ones(1 << 20)            # CPU, managed
y = x.to('cuda:0') * 2             # GPU 0 only
z = torch.empty(1 << 20, device='cuda:0')
torch.cuda.synchronize()
print(primary_context_active(0), primary_context_active(1))
""", timeout=120)
    assert r.stdout.split() == ["True", "False"], r.stdout + r.stderr


@multigpu
def test_torchrun_like_ranks_hold_memory_on_their_own_gpu_only():
    code = _PRIMARY_CONTEXT_ACTIVE + """
import os, sys, torch, torch_uvm      # UVM on at import: PYTORCH_ENABLE_UNIFIED_MEMORY=1
rank = int(os.environ['LOCAL_RANK'])
torch.cuda.set_device(rank)
x = torch.randn(1 << 22, device='cuda')
torch.cuda.synchronize()
print(os.getpid(), primary_context_active(1 - rank), flush=True)
sys.stdin.readline()                  # hold the memory while the parent looks
"""
    env = dict(os.environ, PYTORCH_ENABLE_UNIFIED_MEMORY="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=dict(env, LOCAL_RANK=str(r)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        ready = [p.stdout.readline().split() for p in procs]
        pids = {int(pid): rank for rank, (pid, _) in enumerate(ready)}
        assert [other for _, other in ready] == ["False", "False"], ready
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid",
                              "--format=csv,noheader"], capture_output=True, text=True)
        uuids = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout
        index_of = {u.strip(): int(i) for i, u in (l.split(",") for l in uuids.splitlines())}
        seen = {}
        for line in smi.stdout.splitlines():
            pid, uuid = (v.strip() for v in line.split(","))
            if int(pid) in pids:
                seen.setdefault(int(pid), set()).add(index_of[uuid])
        print("nvidia-smi per process:", seen)
        if seen:  # in a container nvidia-smi may not see the processes
            assert all(gpus == {pids[pid]} for pid, gpus in seen.items()), seen
    finally:
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
            p.wait(timeout=60)
