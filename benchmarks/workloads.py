"""The workloads timed by run.py, each run in a fresh process with one
allocator (PyTorch can choose its CUDA allocator only once per process).

    python workloads.py ALLOCATOR WORKLOAD  -> prints one JSON line

ALLOCATOR: torch (CUDACachingAllocator), raw_managed (cudaMallocManaged per
call), torch_uvm, cupy (CuPy MemoryPool over malloc_managed; allocation only),
rmm (RAPIDS RMM: a managed-memory pool under PrefetchResourceAdaptor, hooked
into torch with rmm_torch_allocator; its wheels travel to the GPU machine).
"""
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def setup(allocator):
    if allocator == "raw_managed":
        so = os.path.join(os.environ.get("BENCH_BUILD", "/tmp"), "raw_managed_alloc.so")
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(so, "raw_alloc", "raw_free"))
    elif allocator == "torch_uvm":
        sys.path.insert(0, os.path.dirname(HERE))
        import torch_uvm
        torch_uvm.set_enabled_uvm(True)
    elif allocator == "rmm":
        import rmm.mr
        from rmm.allocators.torch import rmm_torch_allocator
        # A pool far below the GPU's memory: managed memory past free device
        # memory can stall the GPU.
        pool = rmm.mr.PoolMemoryResource(rmm.mr.ManagedMemoryResource(),
                                         initial_pool_size=1 << 30, maximum_pool_size=16 << 30)
        rmm.mr.set_current_device_resource(rmm.mr.PrefetchResourceAdaptor(pool))
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)


def median_us(fn, iters, warmup=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def alloc(allocator):
    sizes = [512, 4096, MiB, 64 * MiB, 256 * MiB]
    out = {}
    if allocator == "cupy":
        import cupy
        pool = cupy.cuda.MemoryPool(cupy.cuda.malloc_managed)
        cupy.cuda.set_allocator(pool.malloc)
        for n in sizes:
            def step():
                a = cupy.empty(n, dtype=cupy.uint8)
                del a
            out[str(n)] = median_us(step, 2000 if n < 64 * MiB else 300)
        return out
    for n in sizes:
        def step():
            a = torch.empty(n, dtype=torch.uint8, device="cuda")
            del a
        out[str(n)] = median_us(step, 2000 if n < 64 * MiB else 300)
    # A mixed trace: the sizes of one MLP training step's allocations, replayed.
    trace = [256 * 1024 * 4, 1024 * 1024 * 4, 1024 * 4, 256 * 4, 4] * 8
    def mixed():
        live = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in trace]
        del live
    out["mixed_trace_per_alloc"] = median_us(mixed, 300) / len(trace)
    return out


def mlp():
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda(), (lambda: torch.randn(256, 1024, device="cuda"))


def transformer():
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
    return model, (lambda: torch.randn(32, 128, 256, device="cuda"))


def resnet18():
    import torchvision          # on the GPU machines; issue 12 names it
    model = torchvision.models.resnet18(num_classes=1000).cuda()
    return model, (lambda: torch.randn(32, 3, 224, 224, device="cuda"))


def segments(allocator):
    """Training steps under one segment configuration: time and peak reserved."""
    import torch_uvm
    out = {}
    for name, make in (("mlp", mlp), ("transformer", transformer)):
        torch_uvm.empty_cache()
        torch_uvm.reset_peak_memory_stats()
        ms = train_one(make)
        out[name] = {"ms": ms,
                     "peak_reserved": torch_uvm.memory_stats()["reserved_bytes.all.peak"]}
    return out


def train_one(make, steps=50, warmup=10):
    torch.manual_seed(0)
    model, batch = make()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        loss = model(batch()).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
    return median_us(step, steps, warmup=warmup) / 1e3  # ms


def train(allocator):
    # 100 steps a process, and the ratio is taken over five processes a side
    # (one per round). The anchors run fewer: raw_managed is 5-30x slower.
    steps, warmup = {"raw_managed": (5, 2), "rmm": (30, 5)}.get(allocator, (100, 10))
    out = {}
    for name, make in (("mlp", mlp), ("transformer", transformer), ("resnet18", resnet18)):
        out[name] = train_one(make, steps, warmup)
    return out


def uvm_variant():
    """torch_uvm's name in the tables, with its PYTORCH_UVM_ALLOC_CONF if any."""
    conf = os.environ.get("PYTORCH_UVM_ALLOC_CONF")
    return f"torch_uvm[{conf}]" if conf else "torch_uvm"


def moves_to_gpu(allocator):
    """Host time of the call and time until a kernel has read everything."""
    out = {}
    for n in (MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB, 2048 * MiB):
        reps = 4 if n >= 1024 * MiB else 8
        res = {}
        variants = {}
        if allocator == "torch_uvm":
            import torch_uvm
            src = torch.empty(n // 4)  # managed, CPU home
            variants[uvm_variant()] = (src, lambda s=src: s.to("cuda", non_blocking=True))
            if not os.environ.get("PYTORCH_UVM_ALLOC_CONF"):
                variants["torch_uvm blocking"] = (src, lambda s=src: s.to("cuda"))
            if "async_prefetch:false" in os.environ.get("PYTORCH_UVM_ALLOC_CONF", ""):
                def naive(src=src):
                    torch_uvm.set_move_advice(True)
                    try:
                        return src.to("cuda", non_blocking=True)
                    finally:
                        torch_uvm.set_move_advice(False)
                variants["naive_advise_prefetch"] = (src, naive)
        else:
            pinned = torch.empty(n // 4).pin_memory()
            variants["pinned_copy"] = (pinned, lambda p=pinned: p.to("cuda", non_blocking=True))
            if n <= 256 * MiB:   # 6-8x slower: an anchor, not worth seconds more
                pageable = torch.empty(n // 4)
                variants["pageable_copy"] = (pageable, lambda p=pageable: p.to("cuda"))
        for name, (src, fn) in variants.items():
            call, ready, ready_sleeping = [], [], []
            # The host waits two ways: spinning (torch.cuda.synchronize, the
            # default) and asleep on a blocking event, as a thread that has
            # other work or waits in a DataLoader would be.
            for wait in ("spin", "sleep") * reps:
                src.fill_(1.0)          # on the CPU: the pages are host-resident again
                torch.cuda.synchronize()
                done = torch.cuda.Event(blocking=True)
                t0 = time.perf_counter()
                dst = fn()
                t1 = time.perf_counter()
                s = dst.sum()
                if wait == "spin":
                    torch.cuda.synchronize()
                else:
                    done.record()
                    done.synchronize()
                t2 = time.perf_counter()
                assert s.item() == n // 4
                if wait == "spin":
                    call.append((t1 - t0) * 1e3)
                    ready.append((t2 - t0) * 1e3)
                else:
                    ready_sleeping.append((t2 - t0) * 1e3)
                del dst, s
            res[name] = {"call_ms": statistics.median(call), "ready_ms": statistics.median(ready),
                         "ready_sleeping_ms": statistics.median(ready_sleeping)}
        out[str(n)] = res
    return out


def moves_to_cpu(allocator):
    out = {}
    for n in (64 * MiB, 1024 * MiB):
        reps = 5
        res = {}
        if allocator == "torch_uvm":
            src = torch.empty(n // 4, device="cuda")
            buf = torch.zeros(n // 4)    # a CPU tensor whose pages exist
            variants = {uvm_variant(): (src, lambda s=src: s.to("cpu")),
                        # not a move: a copy into it (staged through pinned buffers)
                        "torch_uvm copy into a CPU tensor": (src, lambda s=src, b=buf: b.copy_(s)),
                        # not a move either: PyTorch's copy=True, into a new CPU tensor
                        "torch_uvm .to('cpu', copy=True)":
                            (src, lambda s=src: s.to("cpu", copy=True)),
                        # PyTorch gives a non-blocking copy to the CPU pinned memory
                        "torch_uvm .to('cpu', copy=True, non_blocking=True)":
                            (src, lambda s=src: (s.to("cpu", copy=True, non_blocking=True),
                                                 torch.cuda.synchronize())[0])}
        else:
            src = torch.empty(n // 4, device="cuda")
            pinned = torch.empty(n // 4).pin_memory()
            variants = {
                "pinned_copy": (src, lambda s=src, p=pinned: (p.copy_(s, non_blocking=True), torch.cuda.synchronize())[0]),
                "pageable_copy": (src, lambda s=src: s.to("cpu")),
            }
        for name, (s, fn) in variants.items():
            times = []
            for _ in range(3 if name == "pageable_copy" else reps):
                s.fill_(1.0)            # on the GPU: pages device-resident
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                host = fn()
                total = host.sum().item()   # a CPU read of all the data
                times.append(time.perf_counter() - t0)
                assert total == n // 4
                del host
            t = statistics.median(times)
            res[name] = {"ms": t * 1e3, "GBps": n / t / 1e9}
        out[str(n)] = res
    return out


def copies(allocator):
    """GB/s of copies between the GPU and CPU tensors, blocking, both ways:
    with UVM off, from and into pinned and pageable memory; with UVM on,
    from and into managed CPU tensors (a state dict, a CPU buffer), with
    torch_uvm's fast copies and with PyTorch's (set_fast_copy(False))."""
    out = {}
    for n in (4 * MiB, 64 * MiB, 1024 * MiB):
        gpu = torch.ones(n // 4, device="cuda")
        if allocator == "torch_uvm":
            import torch_uvm
            host = torch.ones(n // 4)              # managed, CPU-resident

            def fast(fn, on):
                def run():
                    torch_uvm.set_fast_copy(on)
                    try:
                        fn()
                    finally:
                        torch_uvm.set_fast_copy(True)
                return run

            def on_cpu(fn):
                host.fill_(1.0)                    # the pages back on the CPU
                torch.cuda.synchronize()
                return fn
            variants = {
                "to_gpu torch_uvm": lambda: on_cpu(fast(lambda: gpu.copy_(host), True)),
                "to_gpu torch_uvm[fast_copy off]":
                    lambda: on_cpu(fast(lambda: gpu.copy_(host), False)),
                "to_cpu torch_uvm": lambda: on_cpu(fast(lambda: host.copy_(gpu), True)),
                "to_cpu torch_uvm[fast_copy off]":
                    lambda: on_cpu(fast(lambda: host.copy_(gpu), False)),
            }
        else:
            pinned = torch.ones(n // 4).pin_memory()
            pageable = torch.ones(n // 4)
            variants = {
                "to_gpu pinned_copy": lambda: (lambda: gpu.copy_(pinned)),
                "to_gpu pageable_copy": lambda: (lambda: gpu.copy_(pageable)),
                "to_cpu pinned_copy": lambda: (lambda: pinned.copy_(gpu)),
                "to_cpu pageable_copy": lambda: (lambda: pageable.copy_(gpu)),
            }
        res = {}
        for name, prepare in variants.items():
            times = []
            for _ in range(4 if n >= 1024 * MiB else 7):
                fn = prepare()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            res[name] = {"ms": t * 1e3, "GBps": n / t / 1e9}
        out[str(n)] = res
        del gpu
    return out


def small_copies(allocator):
    """Microseconds per GPU-to-GPU copy_ on one device, small sizes (issue 20,
    point 6: PyTorch may ask the allocator's memcpyAsync, which looks both
    pointers up under torch_uvm's lock): the host's time per call, and per
    copy over a burst of 1000 then a synchronize."""
    out = {}
    for n in (4 * 1024, 64 * 1024, 1 * MiB):
        src = torch.ones(n // 4, device="cuda")
        dst = torch.empty_like(src)

        def burst():
            for _ in range(1000):
                dst.copy_(src)
            torch.cuda.synchronize()
        name = uvm_variant() if allocator == "torch_uvm" else allocator
        out[str(n)] = {name: {"call_us": median_us(lambda: dst.copy_(src), 2000),
                              "burst_us_per_copy": median_us(burst, 5, warmup=2) / 1000}}
    return out


def faults(allocator):
    """First kernel over host-resident managed data: page faults vs prefetch."""
    import torch_uvm
    n = 512 * MiB
    res = {}
    for mode in ("page_faults", "prefetch", "read_mostly_prefetch", "device_resident"):
        times = []
        for _ in range(3):
            y = torch.empty(n // 4, device="cuda")
            x = y.to("cpu")            # zero-copy, migrated to the host
            x.fill_(1.0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if mode == "prefetch":
                torch_uvm.prefetch(y, "cuda")
            elif mode == "read_mostly_prefetch":
                torch_uvm.advise(y, "read_mostly")
                torch_uvm.prefetch(y, "cuda")
            elif mode == "device_resident":
                torch_uvm.prefetch(y, "cuda")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            s = y.sum()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            assert s.item() == n // 4
            del x, y, s
        t = statistics.median(times)
        res[mode] = {"ms": t * 1e3, "GBps": n / t / 1e9}
    return res


if __name__ == "__main__":
    # workloads.py ALLOCATOR WORKLOAD[,WORKLOAD...]: one JSON line per workload
    allocator, workloads = sys.argv[1], sys.argv[2].split(",")
    if allocator != "cupy":
        setup(allocator)
    for workload in workloads:
        t0 = time.perf_counter()
        result = globals()[workload](allocator)
        print(json.dumps({"allocator": allocator, "workload": workload, "result": result,
                          "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
