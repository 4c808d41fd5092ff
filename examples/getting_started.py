"""Getting started (docs/getting-started.md): turn UVM on, make tensors,
move one to the GPU without a copy, and read the statistics.

    python examples/getting_started.py

Needs a CUDA GPU; without one it says so and exits with status 2.
"""
import os
import sys

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402

MiB = 1 << 20


def main():
    torch_uvm.set_enabled_uvm(True)             # before the first CUDA tensor
    assert torch_uvm.get_enabled_uvm()
    print(f"UVM on, PyTorch's CUDA allocator is now {torch.cuda.get_allocator_backend()!r}")

    x = torch.randn(4 * MiB)                    # 16 MiB, managed, its home the CPU
    assert x.is_managed()
    y = x.to("cuda")                            # a move: same memory, now on the GPU
    assert y.device.type == "cuda" and y.data_ptr() == x.data_ptr()
    print(f"x.to('cuda') is the same memory: {y.data_ptr() == x.data_ptr()}")

    y.mul_(2)                                   # written on the GPU ...
    torch.cuda.synchronize()
    assert torch.equal(x, y.cpu())              # ... and seen through x
    print("a write on the GPU is seen from the CPU tensor")

    z = torch.ones(MiB, device="cuda")          # CUDA tensors are managed too
    assert z.is_managed()
    plain = x.unmanage_memory()                 # an ordinary copy, when you need one
    assert not plain.is_managed() and torch.equal(plain, x)

    stats = torch_uvm.memory_stats()            # torch.cuda.memory_stats()'s keys, CPU and GPUs
    print(f"allocated {stats['allocated_bytes.all.current'] / MiB:.1f} MiB in "
          f"{stats['segment.all.current']} segments; cap {torch_uvm.get_memory_cap() / 2**30:.1f} GiB")
    print(f"torch.cuda.memory_allocated(): {torch.cuda.memory_allocated() / MiB:.1f} MiB "
          "(GPU-homed tensors only)")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU: managed memory lives on one", file=sys.stderr)
        sys.exit(2)
    main()
