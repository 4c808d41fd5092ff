# Small copy_ between GPU tensors: UVM off / on, managed or not (issue 20, point 6)
import sys, time, statistics, subprocess, torch
mode = sys.argv[1] if len(sys.argv) > 1 else "driver"

def per_call(fn, n=5000):
    for _ in range(300): fn()
    torch.cuda.synchronize()
    s = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); s.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(s) * 1e6

if mode == "driver":
    for m in ("off_plain", "off_imported", "on"):
        print(subprocess.run([sys.executable, __file__, m], capture_output=True, text=True).stdout, end="")
    sys.exit()
if mode != "off_plain":
    import torch_uvm
    torch_uvm.set_enabled_uvm(mode == "on")
import cupy
for nbytes in (4096, 1 << 20):
    src = torch.ones(nbytes // 4, device="cuda"); dst = torch.empty_like(src)
    a = torch.from_dlpack(cupy.ones(nbytes // 4, dtype=cupy.float32)); b = torch.empty_like(a) if mode != "on" else torch.from_dlpack(cupy.empty(nbytes // 4, dtype=cupy.float32))
    print(f"{mode:>13} {nbytes:>8} B  torch tensors {per_call(lambda: dst.copy_(src)):6.2f} us   "
          f"cupy-memory tensors {per_call(lambda: b.copy_(a)):6.2f} us   stream {torch.cuda.current_stream().cuda_stream}")
