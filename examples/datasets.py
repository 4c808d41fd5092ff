"""Data larger than the GPU's share for it (docs/datasets.md): 128 MiB of
managed data walked through in 16 MiB batches, at most 64 MiB of them on the
GPU, each batch the same memory seen from the GPU.

    python examples/datasets.py

Needs a CUDA GPU; without one it says so and exits with status 2.
"""
import os
import sys

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402

MiB = 1 << 20
LIMIT = 64 * MiB


def main():
    torch_uvm.set_enabled_uvm(True)                     # the data must be managed memory
    torch_uvm.set_residency_limit(LIMIT)                # batches on cuda:0: at most 64 MiB
    try:
        inputs = torch.randn(32 * MiB // 4, 4)         # 128 MiB, managed, on the CPU
        targets = torch.randn(32 * MiB // 4)
        batches = zip(inputs.split(MiB), targets.split(MiB))   # 16 + 4 MiB a batch
        total = torch.zeros((), device="cuda")
        for x, y in torch_uvm.prefetching(batches, "cuda", ahead=2):
            assert x.is_cuda and x.is_managed()         # the same memory, seen on the GPU
            total += (x.sum(dim=1) - y).square().sum()
        torch.cuda.synchronize()
        want = (inputs.sum(dim=1) - targets).square().sum()
        torch.testing.assert_close(total.cpu(), want, rtol=1e-4, atol=1e-2)
        stats = torch_uvm.residency_stats()
        assert 0 < stats["resident_bytes.peak"] <= LIMIT
        assert stats["evictions.write_home"] == 0       # read-only batches: nothing copied home
        print(f"walked {inputs.nbytes // MiB + targets.nbytes // MiB} MiB in batches; "
              f"at most {stats['resident_bytes.peak'] / MiB:.0f} MiB on the GPU at once "
              f"(limit {LIMIT // MiB}); {stats['prefetched_bytes'] // MiB} MiB brought; "
              f"{stats['evictions.drop']} ranges let go without a copy home")
    finally:
        torch_uvm.evict()                               # the last batches leave now
        torch_uvm.set_residency_limit(None)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU: managed memory lives on one", file=sys.stderr)
        sys.exit(2)
    main()
