# Which ordering puts a bring after writes at home? (mutant probe)
import torch, torch_uvm
torch_uvm.set_enabled_uvm(True)
from torch.profiler import profile, ProfilerActivity
MiB = 1 << 20
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])
x = torch.randn(64, 1024, device="cuda")
h = torch_uvm.offload(model, budget=12 * MiB, mode="prefetch")
with torch.no_grad():
    model(x); torch_uvm.evict("cuda"); torch.cuda.synchronize()
    print("in slots:", [h.executor.bytes_on_gpu(u.index) for u in h.units])
    import time
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        torch.cuda._sleep(200_000_000)
        for p in model.parameters():
            p.mul_(0)
        t1 = time.perf_counter()
        out = model(x)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
    print(f"host: forward call {1e3*(t2-t1):.1f} ms, then synchronize {1e3*(t3-t2):.1f} ms")
    prof.export_chrome_trace("/tmp/probe_trace.json")
    import json, os
    tr = json.load(open("/tmp/probe_trace.json"))["traceEvents"]
    for e in sorted([e for e in tr if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")],
                    key=lambda e: e["ts"])[:30]:
        print(e["ts"], e.get("args", {}).get("stream"), e["name"][:50])
    # and with the CPU ops that took long
    for e in tr:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime") and e.get("dur", 0) > 5000:
            print("slow host:", e["name"][:80], e["dur"])
print("nonzero:", torch.count_nonzero(out).item())
evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
t0 = min(e.time_range.start for e in evs)
for e in sorted(evs, key=lambda e: e.time_range.start)[:40]:
    print(f"{(e.time_range.start - t0)/1e3:9.3f} ms {(e.time_range.end - e.time_range.start)/1e3:8.3f} dev {e.device_index} {e.name[:60]}")
