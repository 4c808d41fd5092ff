"""Out of memory, streams, fork, DataLoader workers, CUDA graphs, and identical
training with UVM on and off (skipped without a GPU)."""
import pytest
import torch

from conftest import gpu, run_python

pytestmark = gpu


def test_oom_past_the_cap_is_catchable_and_recoverable(uvm):
    uvm.empty_cache()
    old_cap = uvm.get_memory_cap()
    # 256 MiB of headroom over whatever other tests still hold.
    uvm.set_memory_cap(uvm.memory_stats()["reserved_bytes.all.current"] + (256 << 20))
    try:
        keep = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        ooms = uvm.memory_stats()["num_ooms"]
        with pytest.raises(torch.OutOfMemoryError, match="cap"):
            torch.empty(200 << 20, dtype=torch.uint8, device="cuda")
        assert uvm.memory_stats()["num_ooms"] == ooms + 1
        assert uvm.memory_stats()["reserved_bytes.all.current"] <= uvm.get_memory_cap()
        del keep
        again = torch.empty(200 << 20, dtype=torch.uint8, device="cuda")
        assert again.numel() == 200 << 20
        del again
    finally:
        uvm.empty_cache()
        uvm.set_memory_cap(old_cap)


def test_cap_above_free_memory_needs_opt_in(uvm):
    with pytest.raises(ValueError, match="allow_oversubscription"):
        uvm.set_memory_cap(uvm._C.safe_cap_limit() + (1 << 30))
    assert uvm.get_memory_cap() < uvm._C.safe_cap_limit()


def test_cap_below_current_use_is_refused(uvm):
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="in use by live tensors"):
        uvm.set_memory_cap(1 << 20)
    del x


def test_record_stream_protects_cross_stream_use(uvm):
    # The example of seeds/004 with torch.cuda._sleep in place of Triton:
    # without record_stream, s1's next allocation would reuse x's block while
    # s2 still reads it.
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(5):
        with torch.cuda.stream(s1):
            x = torch.full((1 << 16,), 1.0, device="cuda")
            x *= 2
            evt = torch.cuda.current_stream().record_event()
        with torch.cuda.stream(s2):
            torch.cuda._sleep(50_000_000)
            torch.cuda.current_stream().wait_event(evt)
            y = x * 3
        x.record_stream(s2)
        ptr = x.data_ptr()
        del x
        with torch.cuda.stream(s1):
            c = torch.full((1 << 16,), 31.0, device="cuda")
        assert c.data_ptr() != ptr, "block handed to s1 while s2 still used it"
        torch.cuda.synchronize()
        assert torch.equal(y, torch.full_like(y, 6.0))


def test_moved_cpu_tensor_is_not_reused_while_gpu_reads_it(uvm):
    x = torch.ones(1 << 16)
    ptr = x.data_ptr()
    torch.cuda._sleep(50_000_000)
    y = x.to("cuda") * 2
    del x
    z = torch.zeros(1 << 16)      # a CPU allocation of the same size
    assert z.data_ptr() != ptr
    torch.cuda.synchronize()
    assert torch.all(y == 2)


def test_enabling_after_cuda_allocation_explains_the_fix():
    r = run_python("""
        import torch, torch_uvm
        torch.ones(1, device='cuda')
        try:
            torch_uvm.set_enabled_uvm(True)
        except RuntimeError as e:
            print('ERR', e)
        print('enabled', torch_uvm.get_enabled_uvm(), torch.ones(2).is_managed())
    """)
    assert "already initialized" in r.stdout and "PYTORCH_ENABLE_UNIFIED_MEMORY" in r.stdout, r.stderr
    assert "enabled False False" in r.stdout


def test_environment_variable_enables_at_import():
    r = run_python("""
        import torch, torch_uvm
        print(torch_uvm.get_enabled_uvm(), torch.ones(3, device='cuda').is_managed())
    """, env={"PYTORCH_ENABLE_UNIFIED_MEMORY": "1"})
    assert r.stdout.strip() == "True True", r.stderr


def test_fork_after_enabling_neither_hangs_nor_crashes():
    r = run_python("""
        import os, torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        x = torch.ones(1000, device='cuda')
        pid = os.fork()
        if pid == 0:
            t = torch.arange(100)               # plain memory in the child
            os._exit(0 if (not t.is_managed() and t.sum().item() == 4950) else 3)
        _, status = os.waitpid(pid, 0)
        print('child', os.waitstatus_to_exitcode(status), x.sum().item())
    """, timeout=120)
    assert r.stdout.strip() == "child 0 1000.0", r.stdout + r.stderr


def test_dataloader_with_workers_trains():
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=64, num_workers=4)
        model = torch.nn.Linear(16, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        first = last = None
        for epoch in range(3):
            for xb, yb in loader:
                loss = torch.nn.functional.mse_loss(model(xb.cuda()), yb.cuda())
                opt.zero_grad(); loss.backward(); opt.step()
                first = first if first is not None else loss.item()
                last = loss.item()
        print('ok', last < first)
    """, timeout=300)
    assert r.stdout.strip() == "ok True", r.stdout + r.stderr


TRAIN = """
import json, torch, torch_uvm
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(256, 64).cuda(); y = torch.randint(0, 10, (256,)).cuda()
torch.backends.cudnn.deterministic = True
losses = []
for _ in range(20):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
print(json.dumps([torch_uvm.get_enabled_uvm(), losses]))
"""


def test_training_gives_identical_losses_with_uvm_on_and_off():
    import json
    off = run_python(TRAIN)
    on = run_python(TRAIN, env={"PYTORCH_ENABLE_UNIFIED_MEMORY": "1"})
    assert off.returncode == 0 and on.returncode == 0, off.stderr + on.stderr
    enabled_off, losses_off = json.loads(off.stdout)
    enabled_on, losses_on = json.loads(on.stdout)
    assert (enabled_off, enabled_on) == (False, True)
    assert losses_on == losses_off


# The scalars in torch.mul(x, 2) and y.add_(1) become CPU tensors during the
# capture; a managed segment for them (cudaMallocManaged) used to break the
# capture. CPU tensors now come from the ordinary allocator while one runs.
def test_cuda_graph_without_allocations_replays():
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        x = torch.ones(1024, device='cuda')
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        try:
            with torch.cuda.stream(s):
                y = x * 2  # warm up
            torch.cuda.synchronize()
            y = torch.empty_like(x)          # static output, allocated before capture
            with torch.cuda.graph(g):
                torch.mul(x, 2, out=y)
                y.add_(1)
            x.fill_(3.0)
            g.replay()
            torch.cuda.synchronize()
            print('replayed', y.sum().item())
        except RuntimeError as e:
            print('error', str(e).splitlines()[0])
    """, timeout=120)
    out = r.stdout.strip()
    assert out == "replayed 7168.0", r.stdout + r.stderr


def test_allocation_during_graph_capture_goes_to_a_private_pool():
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        x = torch.ones(1024, device='cuda')
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = torch.empty(1 << 20, device='cuda')  # a new block, in the graph's pool
            y.fill_(2.0)
            z = (x * 3).sum()
        g.replay()
        torch.cuda.synchronize()
        w = torch.ones(8, device='cuda') * 2      # the ordinary cache goes on
        print(y.sum().item(), z.item(), w.sum().item())
    """, timeout=120)
    assert r.stdout.split() == ["2097152.0", "3072.0", "16.0"], r.stdout + r.stderr


@pytest.mark.xfail(strict=False, reason=(
    "open (issue 11): on an H100, one of the five rounds reuses x's block, yet y is "
    "always intact, so the reuse came after s2's work; why the fence completed early "
    "is not understood yet"))
def test_record_stream_on_a_managed_tensor_with_uvm_off():
    # UVM off: PyTorch's allocator is installed and ignores pointers it does
    # not own, so torch_uvm must hear of the stream itself (issue 11).
    r = run_python("""
        import torch, torch_uvm
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        reused = bad = 0
        with torch.cuda.stream(s1):  # warm up: no first-call delays below
            torch_uvm.manage_memory(torch.empty(1 << 16, device='cuda')).fill_(0)
        torch.cuda.synchronize()
        for _ in range(5):
            with torch.cuda.stream(s1):
                x = torch_uvm.manage_memory(torch.ones(1 << 16, device='cuda'))
                evt = torch.cuda.current_stream().record_event()
            with torch.cuda.stream(s2):
                torch.cuda._sleep(200_000_000)   # s2 reads x ~0.1 s from now
                torch.cuda.current_stream().wait_event(evt)
                y = x * 3
            x.record_stream(s2)
            ptr = x.data_ptr()
            del x
            with torch.cuda.stream(s1):
                z = torch_uvm.manage_memory(torch.empty(1 << 16, device='cuda'))
                reused += z.data_ptr() == ptr
                z.fill_(0)                        # would clobber x before s2 reads it
            torch.cuda.synchronize()
            bad += not torch.equal(y, torch.full_like(y, 3.0))
        print(torch_uvm.get_enabled_uvm(), reused, bad)
    """, timeout=120)
    assert r.stdout.split() == ["False", "0", "0"], r.stdout + r.stderr


def test_fork_while_other_threads_allocate_and_move():
    # Nobody may hold the allocator's lock across fork(), or the child's
    # first allocation waits forever (issue 11).
    r = run_python("""
        import os, signal, threading, torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        stop = False
        def churn():
            while not stop:
                x = torch.randn(1 << 14)
                y = x.to('cuda') * 2
                z = torch.empty(1 << 15, device='cuda')
                del x, y, z
        threads = [threading.Thread(target=churn) for _ in range(3)]
        for t in threads: t.start()
        bad = 0
        inherited = torch.ones(1 << 12)        # managed, made before the forks
        for i in range(20):
            pid = os.fork()
            if pid == 0:
                signal.alarm(20)               # a hung child dies of SIGALRM
                t = torch.ones(1 << 12) * 2    # the child's own (ordinary) memory
                ok = (t.sum().item() == 8192 and torch_uvm.is_managed(inherited)
                      and not torch_uvm.is_managed(t)
                      and torch_uvm.memory_stats()['allocation.all.current'] > 0)
                os._exit(0 if ok else 3)
            _, status = os.waitpid(pid, 0)
            bad += status != 0
        stop = True
        for t in threads: t.join()
        print('bad', bad)
    """, timeout=300)
    assert r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
