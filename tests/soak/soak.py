"""A soak of torch_uvm on the GPU (issue 11): a real training loop with UVM
on, for --minutes, doing at once
  - moves both ways (each batch is made on the CPU and moved to the GPU; the
    loss comes back to the CPU),
  - record_stream across two streams (a side stream reads every batch),
  - a CUDA graph replayed every step (with temporaries in its private pool),
  - empty_cache() from a second thread,
  - an out-of-memory error provoked and recovered every --oom-every seconds.
At the end: allocated bytes are back at the baseline, no warning or error was
swallowed, and the losses equal those of a UVM-off run of the same steps
(--check-steps of them, replayed in a fresh process).

    python tests/soak/soak.py --minutes 10 --out soak.json
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 512)).cuda()


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(64, 512, generator=g), torch.randn(64, 512, generator=g)


def train(steps=None, minutes=None, uvm=False, oom_every=60.0, log=print, on_ready=None):
    """Runs training steps; returns the list of losses (floats). `on_ready`
    runs once the graph is captured (no other thread may make driver calls
    during a capture in PyTorch's default, global capture mode)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    side = torch.cuda.Stream()
    # A graph of a fixed computation, replayed every step: its output feeds
    # nothing the losses depend on, so UVM on and off compare equal.
    static_in = torch.randn(256, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (static_in @ static_in).relu_()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = (static_in @ static_in).relu() + 1  # temporaries in the pool
    if on_ready is not None:
        on_ready()
    losses, ooms, step, side_sum = [], 0, 0, 0.0
    deadline = None if minutes is None else time.time() + 60 * minutes
    next_oom = time.time() + oom_every
    while (steps is None or step < steps) and (deadline is None or time.time() < deadline):
        x_cpu, y_cpu = batch(step)
        x, y = x_cpu.to("cuda"), y_cpu.to("cuda")  # zero-copy moves with UVM on
        with torch.cuda.stream(side):                # another stream reads the batch
            side.wait_stream(torch.cuda.current_stream())
            side_val = (x * 2).sum()
        x.record_stream(side)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        graph.replay()
        losses.append(loss.detach().to("cpu").item())  # GPU -> CPU
        side.synchronize()
        side_sum += side_val.item()
        if uvm and time.time() >= next_oom:
            import torch_uvm
            try:
                torch.empty(torch_uvm.get_memory_cap() + (1 << 30), dtype=torch.uint8,
                            device="cuda")
                raise AssertionError("no OOM past the cap")
            except torch.OutOfMemoryError:
                ooms += 1
            next_oom = time.time() + oom_every
            log(f"step {step}: loss {losses[-1]:.6f}, OOM {ooms} provoked and recovered, "
                f"allocated {torch.cuda.memory_allocated()} B")
        step += 1
    torch.cuda.synchronize()
    assert torch.isfinite(static_out).all()
    del graph, static_out, static_in
    return losses, ooms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--oom-every", type=float, default=60.0)
    p.add_argument("--check-steps", type=int, default=3000)
    p.add_argument("--out", default="soak.json")
    p.add_argument("--replay-off", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.replay_off:  # the UVM-off reference, in its own process
        losses, _ = train(steps=args.replay_off)
        print(json.dumps(losses))
        return

    import torch_uvm
    torch_uvm.set_enabled_uvm(True)
    stop = threading.Event()
    emptied = [0]
    errors = []

    def empty_cache_loop():
        while not stop.is_set():
            try:
                torch_uvm.empty_cache()
                emptied[0] += 1
            except Exception as e:  # counted, never swallowed
                errors.append(repr(e))
            time.sleep(0.05)

    t0 = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        # PyTorch keeps a cuBLAS workspace per stream for the process's life
        # (32 MiB each on Hopper): not ours, so cleared on both sides.
        torch._C._cuda_clearCublasWorkspaces()
        baseline = torch.cuda.memory_allocated()
        emptier = threading.Thread(target=empty_cache_loop)
        try:
            losses, ooms = train(minutes=args.minutes, uvm=True, oom_every=args.oom_every,
                                 log=lambda m: print(f"[{time.time() - t0:6.1f} s] {m}", flush=True),
                                 on_ready=emptier.start)
        finally:
            stop.set()
            if emptier.is_alive():
                emptier.join()
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        end_allocated = torch.cuda.memory_allocated()
    uvm_warnings = [str(w.message) for w in caught if "torch_uvm" in str(w.message)]

    n = min(args.check_steps, len(losses))
    off = subprocess.run([sys.executable, __file__, "--replay-off", str(n)], capture_output=True,
                         text=True, env={k: v for k, v in os.environ.items()
                                         if k != "PYTORCH_ENABLE_UNIFIED_MEMORY"})
    assert off.returncode == 0, off.stderr
    losses_off = json.loads(off.stdout.strip().splitlines()[-1])
    mismatches = sum(a != b for a, b in zip(losses[:n], losses_off))
    result = {
        "minutes": round((time.time() - t0) / 60, 2), "steps": len(losses), "ooms": ooms,
        "empty_cache_calls": emptied[0], "errors": errors, "torch_uvm_warnings": uvm_warnings,
        "allocated_baseline": baseline, "allocated_end": end_allocated,
        "compared_steps": n, "loss_mismatches": mismatches,
        "first_losses": losses[:3], "last_loss": losses[-1],
        "stats": {k: v for k, v in torch_uvm.memory_stats().items()
                  if k.startswith(("num_", "allocation.all", "reserved_bytes.all"))},
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    ok = (end_allocated == baseline and not errors and not uvm_warnings and mismatches == 0
          and ooms >= int(args.minutes * 60 / args.oom_every) - 1)
    print("SOAK", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
