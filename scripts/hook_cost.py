"""What an offload whose every unit is resident costs a forward, on a GPU:
a diagnostic, not a benchmark (no rounds, no ratios with spreads).

    PYTHONPATH=. python3 scripts/hook_cost.py

Prints the milliseconds of a forward of 300 fp16 Linear(512) layers at
batch 1, all resident: plain, with a no-op pre- and post-hook on each,
and offloaded with a budget that holds them all; then cProfile's top
functions of the offloaded forwards; then a 32-layer Llama of hidden 1024
generating 16 tokens, resident and offloaded (every unit resident), with
cProfile's top functions. The per-unit cost is the difference over the
units (benchmarks/results/2026-11-30-h200-x2/hook_cost.log)."""
import cProfile
import io
import pstats
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torch_uvm

def timed(fn, n=20):
    fn(); torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e3

def seq_model():
    return torch.nn.Sequential(*[torch.nn.Linear(512, 512, dtype=torch.float16) for _ in range(300)])

x = torch.randn(1, 512, device="cuda", dtype=torch.float16)
with torch.no_grad():
    m = seq_model().cuda()
    print(f"Sequential 300 Linears resident: {timed(lambda: m(x)):.3f} ms")
    hs = [mm.register_forward_pre_hook(lambda *a: None) for mm in m] + [mm.register_forward_hook(lambda *a: None) for mm in m]
    print(f"  with no-op hooks: {timed(lambda: m(x)):.3f} ms")
    for h in hs: h.remove()
    m = seq_model()
    h = torch_uvm.offload(m, budget=1 << 30)
    print(f"  offloaded, budget 1 GiB (all resident): {timed(lambda: m(x)):.3f} ms; units {len(h.state.units)}")
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): m(x)
    torch.cuda.synchronize(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14); print(s.getvalue()[:3500])
    h.undo()

cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=32, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000)
ids = torch.randint(0, 32000, (1, 64), device="cuda")
def gen(model):
    return lambda: model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
with torch.no_grad():
    torch.manual_seed(0)
    lm = LlamaForCausalLM(cfg).to(torch.bfloat16).cuda().eval()
    r = timed(gen(lm), n=2) / 16
    print(f"Llama 32 layers resident: {r:.2f} ms/token")
    torch.manual_seed(0)
    lm = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    h = torch_uvm.offload(lm, budget=8 << 30)
    o = timed(gen(lm), n=2) / 16
    print(f"  offloaded all resident: {o:.2f} ms/token ({o/r:.2f}x), units {len(h.state.units)}")
    pr = cProfile.Profile(); pr.enable(); gen(lm)(); torch.cuda.synchronize(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(16); print(s.getvalue()[:4000])
