"""Seeing what moves (docs/seeing-what-moves.md): torch_uvm.profile's
timeline of an offloaded model, torch_uvm's ranges in a torch.profiler
trace, and the driver's own counters of migrations and page faults.

    python examples/seeing_what_moves.py

Writes residency.json and trace.json into a temporary folder. Needs a CUDA
GPU; without one it says so and exits with status 2.
"""
import json
import os
import sys
import tempfile

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402

MiB = 1 << 20


def the_residency_timeline(folder):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])   # 8 x 4 MiB
    x = torch.randn(64, 1024, device="cuda")
    handle = torch_uvm.offload(model, budget=16 * MiB, mode="prefetch")
    try:
        with torch.no_grad():
            model(x)                                       # the first forward learns the order
        with torch_uvm.profile() as p:
            with torch.no_grad():
                model(x)
        print(p.summary())                                 # per submodule: MiB arrived, dropped, ...
        arrived = {e["label"] for e in p.timeline() if e["kind"] == "arrive"}
        streamed = [u.name for u in handle.units_in_order() if u not in handle.resident_units()]
        assert streamed and set(streamed) <= arrived
        p.to_json(os.path.join(folder, "residency.json"))  # every event; p.plot() needs matplotlib

        # The same forward in a torch.profiler trace: torch_uvm's work as named ranges.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            with torch.no_grad():
                model(x)
            torch.cuda.synchronize()
        path = os.path.join(folder, "trace.json")          # open it at ui.perfetto.dev
        prof.export_chrome_trace(path)
        with open(path) as f:
            ours = sorted({e["name"] for e in json.load(f)["traceEvents"]
                           if e.get("name", "").startswith("torch_uvm::")})
        # brought ahead while an earlier submodule ran, or on demand
        assert {f"torch_uvm::bring_ahead {streamed[-1]}", f"torch_uvm::bring {streamed[-1]}"} & set(ours)
        print(f"torch_uvm's ranges in the trace: {ours[:4]} ...")
    finally:
        handle.undo()


def the_drivers_counters():
    # Managed memory made on the GPU, then sent to the CPU: a kernel that
    # reads it without a prefetch page-faults, one after a prefetch does not.
    x = torch.ones(8 * MiB, device="cuda")                 # 32 MiB
    torch_uvm.prefetch(x, "cpu")
    torch.cuda.synchronize()
    with torch_uvm.profile(names={"x": x}) as p:
        x.sum()
        torch.cuda.synchronize()
    if p.counters_missing:                                 # no CUPTI here: say why, and stop
        print(f"the driver's counters are not recorded here: {p.counters_missing}")
        return
    faulted = p.moved(x)
    assert faulted["gpu_faults"] > 0
    print(f"without a prefetch: {faulted['gpu_faults']} GPU page faults on x")

    torch_uvm.prefetch(x, "cpu")
    torch.cuda.synchronize()
    with torch_uvm.expect_no_gpu_faults(x) as p:           # AssertionError if the GPU faulted
        torch_uvm.prefetch(x, "cuda")
        x.sum()
    print(f"with a prefetch: no fault; {p.moved(x)['prefetched'] // MiB} MiB prefetched")


def main():
    torch_uvm.set_enabled_uvm(True)
    with tempfile.TemporaryDirectory() as folder:
        the_residency_timeline(folder)
    the_drivers_counters()


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    main()
