"""The diagnosis of the full fine-tune that passed its gpu_memory bound
(tests/results/2026-11-28-h200/README.md): test_gpu_bound's full fine-tune,
its bound half way between sending activations home and not, in a fresh
process, then after a checkpointed LoRA-style run in the same process.
After each forward, backward and step: mem_get_info, the allocator's books,
and its segments by stream. (The run on 788b970 printed 2 steps and no
segments; the one after the fix, 3 steps with them.)

    python3 bound-diag.py full-fresh lora full-after-lora   (from the repo root)
"""
import sys, threading, gc
sys.path.insert(0, "tests/python")
import torch, torch_uvm
torch_uvm.set_enabled_uvm(True)
from test_gpu_bound import llama, held_now, lora_style, bound_streaming

G = 2**30
def used():
    f, t = torch.cuda.mem_get_info(); return t - f

class Sampler:
    def __enter__(self):
        self.peak, self.at, self.phase, self.done = used(), "start", "start", threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True); self.t.start(); return self
    def run(self):
        while not self.done.wait(0.0005):
            u = used()
            if u > self.peak:
                self.peak, self.at = u, self.phase
    def __exit__(self, *a):
        torch.cuda.synchronize(); self.done.set(); self.t.join()

def books(tag):
    s = torch_uvm.memory_stats()
    keys = ["allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current", "reserved_bytes.all.peak"]
    keys += [k for k in s if k.startswith("slots.") and "bytes" in k]
    groups = {}
    for seg in torch_uvm.memory_snapshot():
        k = (seg.get("stream"), seg.get("segment_type"))
        g = groups.setdefault(k, [0, 0, 0])
        g[0] += seg.get("total_size", 0); g[1] += seg.get("allocated_size", 0); g[2] += 1
    print("    segments by stream:", {str(k): [round(v[0]/G, 3), round(v[1]/G, 3), v[2]] for k, v in groups.items()})
    print(f"  {tag}: used {used()/G:.3f} " + ", ".join(f"{k.replace('_bytes','').replace('.all','')} {s[k]/G:.3f}" for k in keys if k in s))

def full(label):
    gc.collect()
    model = llama().train(); model.config.use_cache = False
    batch, seq = 8, 512
    taken = held_now()
    common = dict(task="full", batch=batch, seq=seq, autocast=False, checkpointing=False, new_tokens=0, link_gbps=None, taken=taken)
    on_gpu = torch_uvm.estimate(model, **common)
    home = torch_uvm.estimate(model, activations_home=True, **common)
    bound = (home.least_gpu + on_gpu.least_gpu) // 2
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=batch, seq=seq)
    print(f"== {label}: bound {bound/G:.3f} taken {taken/G:.3f}")
    print(handle.state.bound.plan.table())
    torch_uvm.reset_peak_memory_stats()
    opt = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    gen = torch.Generator().manual_seed(2)
    with Sampler() as s:
        for step in range(3):
            ids = torch.randint(0, 32000, (batch, seq), generator=gen).cuda()
            s.phase = f"fwd{step}"; loss = model(input_ids=ids, labels=ids).loss; torch.cuda.synchronize(); books(f"after fwd{step}")
            s.phase = f"bwd{step}"; loss.backward(); torch.cuda.synchronize(); books(f"after bwd{step}")
            s.phase = f"step{step}"; opt.step(); opt.zero_grad(); torch.cuda.synchronize(); books(f"after step{step}")
    print(f"  PEAK {s.peak/G:.3f} at {s.at} vs bound {bound/G:.3f}; over {(s.peak-bound)/G:.3f}")
    print("  activations stats:", handle.state.bound._activations.stats() if handle.state.bound._activations else None)
    handle.undo()

def lora():
    model = lora_style(llama()).train(); model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    bound, w = bound_streaming(model, "lora", 4, 512, checkpointing=True)
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=4, seq=512)
    opt = handle.stream_optimizer(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4))
    for _ in range(2):
        ids = torch.randint(0, 32000, (4, 512)).cuda()
        model(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()
    torch.cuda.synchronize(); print(f"lora done, used {used()/G:.3f}")

for label in sys.argv[1:]:
    full(label) if label.startswith("full") else lora()
