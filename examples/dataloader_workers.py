"""DataLoader workers and other processes with UVM on (docs/processes.md):
forkserver workers by default, forked workers reading copies of the
dataset, and the clear error for sending a CUDA tensor to another process.

    python examples/dataloader_workers.py

Needs a CUDA GPU; without one it says so and exits with status 2.
"""
import multiprocessing
import os
import sys

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402


def child(t):
    print("the child got", t.sum().item())


def forkserver_workers():
    data = torch.utils.data.TensorDataset(torch.arange(256.0).view(128, 2))   # managed
    loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=2)
    total = sum(batch.sum().item() for (batch,) in loader)
    assert total == 32640.0
    print(f"{multiprocessing.get_start_method()} workers read the dataset: sum {total}")


def forked_workers():
    data = torch.utils.data.TensorDataset(torch.arange(256.0).view(128, 2))   # managed
    loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=2,
                                         multiprocessing_context="fork")
    total = sum(batch.sum().item() for (batch,) in loader)   # each worker reads a copy
    assert total == 32640.0 and torch_uvm.is_managed(data.tensors[0])   # ours is unchanged
    print(f"forked workers read copies of the dataset: sum {total}")


def cuda_tensors_stay_in_this_process():
    t = torch.ones(16, device="cuda")
    process = multiprocessing.get_context("spawn").Process(target=child, args=(t,))
    try:
        process.start()                                  # pickles t: refused before sending
        process.join()
        raise AssertionError("a managed CUDA tensor was sent to another process")
    except RuntimeError as e:
        assert "CUDA IPC" in str(e)
        print(f"sending a CUDA tensor: RuntimeError ({str(e)[:70]}...)")
    on_cpu = t.to("cpu", copy=True)                      # a CPU tensor: sent through shared memory
    process = multiprocessing.get_context("spawn").Process(target=child, args=(on_cpu,))
    process.start()
    process.join()
    assert process.exitcode == 0


def main():
    torch_uvm.set_enabled_uvm(True)                      # also makes forkserver the start method
    forkserver_workers()
    forked_workers()
    cuda_tensors_stay_in_this_process()


if __name__ == "__main__":                               # forkserver re-runs this file in workers
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU: managed memory lives on one", file=sys.stderr)
        sys.exit(2)
    main()
