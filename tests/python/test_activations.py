"""torch_uvm.offload_activations without a GPU: bad input is refused before
anything changes, CPU tensors are left as they are, and a host that cannot
pin a home gets an error naming the sizes and what to do."""
import pytest
import torch

import torch_uvm
from torch_uvm import activations


@pytest.mark.parametrize("name, value", [("min_bytes", -1), ("window", -5), ("window", 1.5),
                                         ("min_bytes", "1M"), ("window", True),
                                         ("budget", -1)])
def test_bad_input_is_refused(name, value):
    with pytest.raises(ValueError, match=f"{name} must be (an int of )?bytes"):
        torch_uvm.offload_activations(**{name: value})


def test_cpu_tensors_are_kept_and_the_results_are_the_same():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 1))
    x = torch.randn(512, 256)
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with torch_uvm.offload_activations(min_bytes=0) as hooks:
        loss = model(x).sum()
    loss.backward()
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))
    s = hooks.stats()
    assert s["kept"] >= 3 and s["sent"] == 0, s


def test_a_home_that_cannot_be_pinned_names_the_sizes(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")
    monkeypatch.setattr(activations.torch, "empty_like", fail)
    with pytest.raises(torch.OutOfMemoryError, match=r"cannot pin 4096 bytes .*\(32, 32\), "
                       r"torch.float32.*raise min_bytes"):
        activations._pinned_home(torch.zeros(32, 32))


def test_dense_means_each_element_once_in_its_span():
    dense = [torch.randn(3, 4), torch.randn(4, 3).t(), torch.randn(2, 3, 4).permute(2, 0, 1),
             torch.randn(1, 5), torch.empty(0, 3)]
    sparse = [torch.randn(3, 1).expand(3, 4), torch.randn(4, 6)[:, :3], torch.randn(5)[::2]]
    assert all(activations._dense(t) for t in dense)
    assert not any(activations._dense(t) for t in sparse)
