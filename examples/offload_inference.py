"""A model larger than its GPU budget, for inference (docs/inference.md):
128 MiB of weights within 64 MiB of the GPU, the output bit for bit that of
the model all on the GPU. UVM need not be on.

    python examples/offload_inference.py

Needs a CUDA GPU; without one it says so and exits with status 2.
"""
import copy
import os
import sys

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402

MiB = 1 << 20
BUDGET = 64 * MiB


def build_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])   # 8 x 16 MiB


def run(mode):
    model = build_model()                                  # on the CPU
    x = torch.randn(16, 2048, device="cuda")
    with torch.no_grad():
        want = copy.deepcopy(model).cuda()(x)              # all on the GPU, for comparison
    handle = torch_uvm.offload(model, budget=BUDGET, mode=mode)
    try:
        with torch.no_grad():
            outs = [model(x) for _ in range(3)]            # the first forward learns the order
        torch.cuda.synchronize()
        assert all(torch.equal(out, want) for out in outs), "not the all-resident output"
        stats = handle.residency_stats()
        assert stats["resident_bytes.peak"] <= BUDGET
        resident = [u.name for u in handle.resident_units()]
        print(f"mode={mode!r} ran as {handle.mode!r}: output bit-identical; "
              f"peak {stats['resident_bytes.peak'] / MiB:.0f} MiB of {BUDGET // MiB}; "
              f"resident submodules {resident} (the end of the order); "
              f"least budget {handle.least_budget(training=False) / MiB:.0f} MiB")
    finally:
        handle.undo()                                      # the module as it was
    assert not any(p.is_cuda for p in model.parameters())  # back on the CPU, values kept


def main():
    run("auto")         # 16 rows and 16 MiB layers beside 64 MiB: reads in place
    run("prefetch")     # copies each streamed layer into GPU memory one layer ahead


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    main()
