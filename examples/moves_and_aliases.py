"""Moves and aliases (docs/moves.md): what `.to(device)` of a managed tensor
returns, when a copy still happens, and how to get a GPU result to the CPU
at the link's speed.

    python examples/moves_and_aliases.py

Needs a CUDA GPU; without one it says so and exits with status 2.
"""
import os
import sys

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402

MiB = 1 << 20


def moves_are_the_same_memory():
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    view = base[1:, ::2, 1:4].transpose(0, 2)       # a strided view moves as it is
    moved = view.to("cuda")
    assert moved.data_ptr() == view.data_ptr()
    assert moved.stride() == view.stride() and moved.storage_offset() == view.storage_offset()
    moved.zero_()                                   # written through the alias on the GPU
    torch.cuda.synchronize()
    assert base[1:, ::2, 1:4].abs().sum() == 0 and base[0].abs().sum() > 0
    print("a view moved to the GPU keeps its offset and strides; writes go both ways")

    x = torch.randn(16 * MiB // 4)                  # 16 MiB: prefetched by the worker thread
    y = x.to("cuda", non_blocking=True)             # returns at once; the stream waits
    assert torch.equal((y * 2).cpu(), x * 2)          # kernels read what the CPU wrote
    back = y.to("cpu")                              # a move back: the same memory again
    assert back.data_ptr() == x.data_ptr()
    print("non-blocking move to the GPU and back: the same memory throughout")


def when_a_copy_happens():
    x = torch.randn(1000)
    assert x.to("cuda", torch.half).data_ptr() != x.data_ptr()    # dtype changes: a copy
    assert x.to("cuda", copy=True).data_ptr() != x.data_ptr()     # asked for: a copy
    torch_uvm.set_move_on_copy(False)
    try:
        assert x.to("cuda").data_ptr() != x.data_ptr()            # moves copy now
        assert x.uvm_to("cuda").data_ptr() == x.data_ptr()        # except this one
    finally:
        torch_uvm.set_move_on_copy(True)
    print("copies happen on a dtype change, copy=True, or with set_move_on_copy(False)")


def a_result_to_the_cpu_fast():
    result = torch.arange(MiB, dtype=torch.float32, device="cuda") * 3   # written on the GPU
    out = result.to("cpu", copy=True, non_blocking=True)   # a copy into pinned memory
    torch.cuda.synchronize()                               # before reading it
    assert out.is_pinned() and out.data_ptr() != result.data_ptr()
    assert torch.equal(out, torch.arange(MiB, dtype=torch.float32) * 3)
    print("to('cpu', copy=True, non_blocking=True): a pinned copy, at the link's speed")


def autograd_through_moves():
    x = torch.randn(64, 32, requires_grad=True)          # on the CPU
    w = torch.randn(32, 16, device="cuda", requires_grad=True)
    (x.to("cuda") @ w).relu().sum().backward()
    assert x.grad is not None and x.grad.device.type == "cpu"   # the gradient moved back
    print("autograd works through moves: x.grad is on the CPU")


def hints():
    x = torch.randn(4 * MiB)
    torch_uvm.advise(x, "read_mostly")                   # every processor may keep a copy
    torch_uvm.advise(x, "unset_read_mostly")
    torch_uvm.prefetch(x, "cuda")                        # pages to the GPU, on the current stream
    torch.cuda.current_stream().synchronize()
    torch_uvm.prefetch(x, "cpu")
    torch.cuda.synchronize()
    print("advise and prefetch: hints that never change data")


def main():
    torch_uvm.set_enabled_uvm(True)
    moves_are_the_same_memory()
    when_a_copy_happens()
    a_result_to_the_cpu_fast()
    autograd_through_moves()
    hints()


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU: managed memory lives on one", file=sys.stderr)
        sys.exit(2)
    main()
