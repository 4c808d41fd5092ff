# Where a small GPU-to-GPU copy_ spends its time with UVM on (issue 20, point 6)
import time, statistics, torch, torch_uvm, cupy
torch_uvm.set_enabled_uvm(True)

def per_call(fn, n=3000):
    for _ in range(200): fn()
    torch.cuda.synchronize()
    s = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); s.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(s) * 1e6

for nbytes in (4096, 1 << 20):
    src = torch.ones(nbytes // 4, device="cuda"); dst = torch.empty_like(src)
    stream = torch.cuda.current_stream().cuda_stream
    dev_a = cupy.cuda.memory.alloc(nbytes); dev_b = cupy.cuda.memory.alloc(nbytes)   # cudaMalloc
    rt = cupy.cuda.runtime
    rows = {
        "torch copy_ (managed, torch_uvm's memcpyAsync)": lambda: dst.copy_(src),
        "cudaMemcpyAsync D2D on the same managed pointers": lambda: rt.memcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes, rt.memcpyDeviceToDevice, stream),
        "cudaMemcpyAsync Default on the same managed pointers": lambda: rt.memcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes, rt.memcpyDefault, stream),
        "cudaMemcpyAsync D2D on cudaMalloc memory": lambda: rt.memcpyAsync(dev_b.ptr, dev_a.ptr, nbytes, rt.memcpyDeviceToDevice, stream),
        "cudaStreamGetDevice": (lambda: rt.streamGetDevice(stream)) if hasattr(rt, "streamGetDevice") else None,
        "cudaGetDevice": lambda: rt.getDevice(),
        "empty python lambda": lambda: None,
    }
    for name, fn in rows.items():
        if fn is None: continue
        print(f"{nbytes:>8} B  {per_call(fn):7.2f} us  {name}")
