"""Helpers the offload GPU tests share: what each test leaves behind, the
models they stream, and where the driver says their tensors are."""
import gc

import pytest
import torch

from conftest import where

MiB = 1 << 20


def undo_leftover_offloads():
    """A failed test's offloads live on in its traceback: undo them, so the
    next tests start without them (and without the limit they set)."""
    from torch_uvm.offload import Offloaded
    gc.collect()
    # type(), not isinstance: that reads every object's __class__, and some warn
    for handle in [o for o in gc.get_objects() if type(o) is Offloaded]:
        if getattr(handle.module, "_torch_uvm_offloaded", None) is handle:
            handle.undo()


def make_model(layers=8, width=2048):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def gpu_bytes(model) -> int:
    """The bytes of `model`'s weights in GPU memory now, asked of the driver
    (the preferred location of each weight's memory: a GPU slot, or its home
    on the CPU), apart from torch_uvm's accounting."""
    seen = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if t.numel() and where(t) == "gpu":
            seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def streamed_bytes_on_gpu(model, optimizer) -> int:
    """Weights, gradients and optimizer states (64 KiB and more) in GPU
    memory now, asked of the driver."""
    seen = {}
    for p in model.parameters():
        states = [t for t in optimizer.state.get(p, {}).values()
                  if isinstance(t, torch.Tensor) and t.is_cuda and t.nbytes >= 64 << 10]
        for t in [p] + ([p.grad] if p.grad is not None else []) + states:
            if where(t) == "gpu":
                seen[t.data_ptr()] = t.nbytes
    return sum(seen.values())


@pytest.fixture(autouse=True)
def nothing_left_streamed():
    """Autouse in each GPU test module that imports it: nothing stays
    offloaded after a test, and the GPU's work is done."""
    yield
    if torch.cuda.is_available():
        undo_leftover_offloads()
        torch.cuda.synchronize()
