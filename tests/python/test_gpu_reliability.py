"""Out of memory, streams, fork, DataLoader workers, CUDA graphs, and identical
training with UVM on and off (skipped without a GPU)."""
import textwrap

import pytest
import torch

from conftest import gpu, multigpu, run_python, run_script
from cross_stream import reuse_while_busy

pytestmark = gpu


def test_oom_past_the_cap_is_catchable_and_recoverable(uvm):
    uvm.empty_cache()
    old_cap = uvm.get_memory_cap()
    stats = uvm.memory_stats()
    # 256 MiB of headroom over whatever other tests still hold. A live tensor
    # of an earlier test (a cuBLAS workspace) may keep a segment whose free
    # part no cache emptying returns: a request larger than all that is free
    # in the cache needs a segment of its own, past the headroom.
    free_in_cache = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    uvm.set_memory_cap(stats["reserved_bytes.all.current"] + (256 << 20))
    try:
        keep = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        ooms = uvm.memory_stats()["num_ooms"]
        with pytest.raises(torch.OutOfMemoryError, match="cap"):
            torch.empty(free_in_cache + (200 << 20), dtype=torch.uint8, device="cuda")
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
    busy, reused, bad = reuse_while_busy(lambda t: t)
    assert busy >= 3 and reused == 0 and bad == 0, (busy, reused, bad)


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


def test_record_stream_on_a_managed_tensor_with_uvm_off():
    # UVM off: PyTorch's allocator is installed and ignores pointers it does
    # not own, so torch_uvm must hear of the stream itself (issue 11).
    r = run_python("""
        import torch, torch_uvm
        from cross_stream import reuse_while_busy
        print(torch_uvm.get_enabled_uvm(), *reuse_while_busy(torch_uvm.manage_memory))
    """, timeout=120)
    enabled, busy, reused, bad = r.stdout.split()
    assert enabled == "False" and int(busy) >= 3 and reused == "0" and bad == "0", r.stdout + r.stderr


def test_forked_dataloader_workers_read_the_parents_managed_dataset():
    # fork() does not carry managed memory into the child: a worker reading
    # the parent's dataset died before torch_uvm gave workers copies (issue 11).
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        class Held(torch.utils.data.Dataset):      # tensors in a dict, a list, and views
            def __init__(self):
                base = torch.arange(4096, dtype=torch.float32)
                self.parts = {"x": base.view(512, 8)[:, 2:], "y": [base[100:612]]}
            def __len__(self): return 512
            def __getitem__(self, i): return self.parts["x"][i], self.parts["y"][0][i]
        data = Held()
        shift = torch.full((1,), 1000.0)           # reached only through the collate's closure
        collate = lambda batch: (torch.stack([x for x, _ in batch]) + shift,
                                 torch.stack([y for _, y in batch]))
        before = (data.parts["x"].data_ptr(), torch_uvm.is_managed(data.parts["x"]))
        base = torch.arange(4096, dtype=torch.float64)
        want_x, want_y = base.view(512, 8)[:, 2:] + 1000, base[100:612]
        loader = torch.utils.data.DataLoader(data, batch_size=64, num_workers=2,
                                             multiprocessing_context="fork", collate_fn=collate)
        ok = True
        for epoch in range(2):
            xs, ys = zip(*loader)
            ok &= torch.equal(torch.cat(xs).double(), want_x) and torch.equal(torch.cat(ys).double(), want_y)
        after = (data.parts["x"].data_ptr(), torch_uvm.is_managed(data.parts["x"]))
        print('ok', ok, before == after, after[1])
    """, timeout=300)
    assert r.stdout.split() == ["ok", "True", "True", "True"], r.stdout + r.stderr


def test_a_forked_worker_that_reads_unreachable_managed_memory_gets_a_clear_error():
    # A tensor reached only through globals()["..."] is out of torch_uvm's
    # sight: the worker dies, and the error names the cause and the fixes.
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        HIDDEN = torch.arange(64.0)
        class Sneaky(torch.utils.data.Dataset):
            def __len__(self): return 64
            def __getitem__(self, i): return globals()["HIDDEN"][i]
        loader = torch.utils.data.DataLoader(Sneaky(), batch_size=8, num_workers=1,
                                             multiprocessing_context="fork")
        try:
            list(loader)
            print("no error")
        except RuntimeError as e:
            print("forkserver" in str(e) and "did not find" in str(e))
    """, timeout=300)
    assert r.stdout.split()[-1:] == ["True"], r.stdout + r.stderr


SCRIPT_WITH_WORKERS = textwrap.dedent("""
    import multiprocessing, torch, torch_uvm
    def main():
        torch_uvm.set_enabled_uvm(True)
        data = torch.utils.data.TensorDataset(torch.arange(256.0).view(128, 2))
        loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=2)
        total = sum(batch.sum().item() for (batch,) in loader)
        print('sum', total, multiprocessing.get_start_method(), torch_uvm.is_managed(data.tensors[0]))
""")


def test_script_without_a_main_guard_gets_working_workers(tmp_path):
    # forkserver re-runs the script in each worker: unguarded, the workers
    # used to start workers of their own and die (issue 11).
    r = run_script(tmp_path / "unguarded.py", SCRIPT_WITH_WORKERS + "main()\n", timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["sum", "32640.0", "forkserver", "True"], \
        r.stdout + r.stderr
    assert 'outside an `if __name__ == "__main__":` block' in r.stderr, r.stderr


def test_script_with_a_main_guard_uses_forkserver_workers(tmp_path):
    # forkserver sends the dataset through shared memory: as PyTorch does for
    # any CPU tensor sent to another process, its storage moves there.
    r = run_script(tmp_path / "guarded.py",
                   SCRIPT_WITH_WORKERS + "if __name__ == '__main__':\n    main()\n", timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["sum", "32640.0", "forkserver", "False"], \
        r.stdout + r.stderr
    assert "outside an" not in r.stderr, r.stderr


def test_fork_while_other_threads_allocate_and_move():
    # Nobody may hold the allocator's lock across fork(), or the child's
    # first allocation waits forever (issue 11).
    r = run_python("""
        import faulthandler, os, signal, sys, threading, torch, torch_uvm
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
        codes = []                             # each child's: 3 a check failed, 1 or -14 it hung
        inherited = torch.ones(1 << 12)        # managed, made before the forks
        for i in range(20):
            pid = os.fork()
            if pid == 0:
                # a hung child prints where it hangs and exits 1 (or dies of SIGALRM)
                faulthandler.dump_traceback_later(15, exit=True)
                signal.alarm(20)
                t = torch.ones(1 << 12) * 2    # the child's own (ordinary) memory
                checks = {'sum': t.sum().item() == 8192,
                          'inherited managed': torch_uvm.is_managed(inherited),
                          'own not managed': not torch_uvm.is_managed(t),
                          'stats': torch_uvm.memory_stats()['allocation.all.current'] > 0}
                failed = [k for k, ok in checks.items() if not ok]
                if failed:
                    print('child', i, 'failed', failed, file=sys.stderr, flush=True)
                os._exit(3 if failed else 0)
            _, status = os.waitpid(pid, 0)
            codes.append(os.waitstatus_to_exitcode(status))
        stop = True
        for t in threads: t.join()
        print('bad', sum(c != 0 for c in codes), 'exit codes', *codes)
    """, timeout=300)
    assert r.stdout.split()[:2] == ["bad", "0"], r.stdout + r.stderr


def test_memory_stats_in_a_forked_child_reads_only_the_allocators_books():
    # The residency books are the parent's GPUs', and another thread of the
    # parent may have held their lock at the fork: a child reads the
    # allocator's (whose lock the fork handlers free), and no GPU.
    r = run_python("""
        import os, torch, torch_uvm
        torch_uvm.set_enabled_uvm(True)
        torch_uvm.set_residency_limit(64 << 20, 'cuda:0')
        x = torch.ones(1 << 12)
        parent = 'residency.cuda:0.limit' in torch_uvm.memory_stats()
        pid = os.fork()
        if pid == 0:
            keys = torch_uvm.memory_stats()
            os.write(1, (' '.join(['child', str(any('.cuda:' in k for k in keys)),
                                   str(keys['allocation.all.current'] > 0)]) + '\\n').encode())
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print('parent', parent, os.waitstatus_to_exitcode(status))
    """, timeout=120)
    assert r.stdout.split() == ["child", "False", "True", "parent", "True", "0"], \
        r.stdout + r.stderr


def test_a_host_that_cannot_pin_a_home_is_an_out_of_memory_error():
    # A streamed tensor's home is pinned host memory (offload makes one per
    # weight through _C.pinned_home). An expanded tensor says it holds 1 PiB
    # in 8 bytes: no host pins that, and the driver refuses it before pinning
    # anything (the page table alone would be terabytes). In a process of its
    # own, so that a driver that took long to refuse cannot hold the suite.
    r = run_python("""
        import torch, torch_uvm
        from torch_uvm import _C
        torch_uvm.set_enabled_uvm(True)
        huge = torch.zeros(1, dtype=torch.float64).expand(1 << 47)      # 2**50 bytes
        try:
            _C.pinned_home(huge, torch.device('cuda', 0))
            print('pinned')
        except torch.OutOfMemoryError as e:
            print(str(e).splitlines()[0])
        home = _C.pinned_home(torch.arange(4.0), torch.device('cuda', 0))   # the process goes on
        print(_C.is_pinned_home(home), home.device, home.cpu().tolist())
    """, timeout=120)
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2, r.stdout + r.stderr
    assert lines[0].startswith("torch_uvm: cannot pin 1125899906842624 bytes of host memory for "
                               "a streamed tensor's home: the host is out of memory it can pin "
                               "(see ulimit -l)"), r.stdout + r.stderr
    assert lines[1] == "True cuda:0 [0.0, 1.0, 2.0, 3.0]", r.stdout + r.stderr


def test_adopting_a_copy_too_small_in_a_forked_child_names_both_sizes():
    # In a forked DataLoader worker, _workers.py points each managed CPU
    # storage at a copy the child inherited; a copy smaller than the storage
    # would let the child read past its end. (Outside a forked child the call
    # is refused: test_api.py.)
    r = run_python("""
        import os, torch, torch_uvm
        from torch_uvm import _C
        torch_uvm.set_enabled_uvm(True)
        x = torch.ones(1000, device='cuda')      # the allocator, and its fork handlers, exist
        owner = torch.ones(16)                   # managed: 64 bytes
        pid = os.fork()
        if pid == 0:
            said = []
            for copy in (torch.zeros(15), torch.zeros(32)[::2]):    # 60 bytes; not contiguous
                try:
                    _C.adopt_copy_in_forked_child(owner, copy)
                    said.append('adopted')
                except RuntimeError as e:
                    said.append(str(e).splitlines()[0])
            _C.adopt_copy_in_forked_child(owner, torch.full((16,), 7.0))   # one that fits
            said.append(str(owner.sum().item()))
            os.write(1, ('\\n'.join(said) + '\\n').encode())
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print('child', os.waitstatus_to_exitcode(status), owner.sum().item())
    """, timeout=120)
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4, r.stdout + r.stderr
    assert lines[0].startswith("torch_uvm: the copy for a forked worker must be a contiguous CPU "
                               "tensor of at least 64 bytes, got 60 bytes on cpu"), lines
    assert lines[1].startswith("torch_uvm: the copy for a forked worker must be a contiguous"), lines
    assert lines[2:] == ["112.0", "child 0 16.0"], lines     # the parent's storage untouched


@multigpu
def test_offloading_a_module_whose_tensors_are_on_two_real_gpus_names_them(uvm):
    # With fake tensors on any machine: test_api.py; here with real ones.
    model = torch.nn.Sequential(torch.nn.Linear(64, 64).to("cuda:0"),
                                torch.nn.Linear(64, 64).to("cuda:1"))
    params = list(model.parameters())
    with pytest.raises(ValueError, match=r"the module's tensors are on \['cuda:0', 'cuda:1'\]; "
                                         r"offload needs them on the CPU or on cuda:0 alone"):
        uvm.offload(model, budget=16 << 20, device="cuda:0")
    model[0].to("cuda:1")
    params = list(model.parameters())
    with pytest.raises(ValueError, match=r"the module's tensors are on \['cuda:1'\]; "
                                         r"offload needs them on the CPU or on cuda:0 alone"):
        uvm.offload(model, budget=16 << 20, device="cuda:0")
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    uvm.offload(model, budget=16 << 20, device="cuda:1").undo()    # on the GPU it streams to
