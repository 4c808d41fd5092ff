"""Two GPUs (issue 21): data-parallel training with UVM on through torchrun,
moves between GPUs, and larger-than-the-GPU on the second GPU while the first
is busy. Each test skips on a machine with fewer than two GPUs."""
import json
import os
import random

import pytest
import torch

from conftest import (LAST_PREFETCH_LOCATION, ROOT, _cudart, memory_device, memory_type,
                      multigpu, range_attribute, torchrun)

pytestmark = multigpu
TRAIN = os.path.join(ROOT, "tests", "multigpu", "train_ranks.py")
MiB = 1 << 20


def train(tmp_path, mode: str, uvm: int) -> dict:
    out = tmp_path / f"{mode}-uvm{uvm}.json"
    r = torchrun(TRAIN, "--mode", mode, "--uvm", str(uvm), "--out", str(out))
    assert r.returncode == 0, f"{mode} uvm={uvm}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(out.read_text())


def losses(run: dict):
    return [rank["losses"] for rank in run["ranks"]]


def assert_memory_on_own_gpu_only(run: dict):
    """PyTorch's statistics, the driver's contexts and nvidia-smi agree: each
    rank holds memory on its own GPU and nothing on the other."""
    for rank in run["ranks"]:
        own = rank["device"]
        assert rank["memory"][own] > 0, rank
        assert all(v == 0 for d, v in rank["memory"].items() if d != own), rank
        assert rank["contexts"] == {d: d == own for d in rank["contexts"]}, rank
    print("nvidia-smi per process:", run["nvidia_smi"])
    for rank in run["ranks"]:   # in a container nvidia-smi may not see the processes
        seen = run["nvidia_smi"].get(str(rank["pid"]))
        if seen is not None:
            assert seen == [int(rank["device"].split(":")[1])], (rank, seen)


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_data_parallel_training_with_uvm_gives_the_losses_of_uvm_off(tmp_path, mode):
    on, off = train(tmp_path, mode, 1), train(tmp_path, mode, 0)
    assert losses(on) == losses(off)
    assert losses(on)[0] != losses(on)[1]          # each rank its own batches
    assert_memory_on_own_gpu_only(on)


@pytest.mark.parametrize("trainer", ["lightning", "accelerate"])
def test_each_rank_streaming_its_replica_through_a_trainer_gives_the_trainers_resident_ddp(
        tmp_path, trainer):
    """Lightning's Trainer (torch_uvm.lightning.OffloadDDPStrategy) and
    accelerate's Accelerator over two cards, each rank's replica offloaded
    under half the model's bytes: the losses and weights of the same loop
    all resident under DDP (issue 57, point 4)."""
    streamed = train(tmp_path, f"{trainer}_offload", 1)
    resident = train(tmp_path, f"{trainer}_resident", 1)
    assert losses(streamed) == losses(resident)
    assert [r["params_sha1"] for r in streamed["ranks"]] == \
        [r["params_sha1"] for r in resident["ranks"]]
    assert losses(streamed)[0] != losses(streamed)[1]          # each rank its own batches
    assert_memory_on_own_gpu_only(streamed)


def test_each_rank_streaming_its_replica_gives_the_losses_of_resident_ddp(tmp_path):
    """DDP over two cards, each rank's replica offloaded under half the
    model's bytes: the path when the model does not fit one card."""
    streamed, resident = train(tmp_path, "ddp_offload", 1), train(tmp_path, "ddp_resident", 1)
    assert losses(streamed) == losses(resident)
    assert_memory_on_own_gpu_only(streamed)


def test_a_thousand_random_moves_between_gpus_and_the_cpu_keep_the_data(uvm):
    rng = random.Random(0)
    places = ["cuda:0", "cuda:1", "cpu"]
    for dtype in (torch.float32, torch.float16, torch.int64):
        x = (torch.arange(1 << 16) % 251).to(dtype)
        want = x.clone().unmanage_memory()
        view = x[128:4096:3]                      # a strided view moves with its base
        for _ in range(1000 // 3 + 1):
            to = rng.choice(places)
            x = x.to(to, non_blocking=rng.random() < 0.5)
            view = view.to(to)
        torch.cuda.synchronize()
        assert torch.equal(x.cpu().unmanage_memory(), want)
        assert torch.equal(view.cpu().unmanage_memory(), want[128:4096:3])


@pytest.mark.parametrize("peer", [True, False])
def test_a_kernel_on_cuda1_reads_data_resident_on_cuda0(uvm, peer):
    lib = _cudart()
    can = torch.cuda.can_device_access_peer(1, 0)
    if peer and not can:
        pytest.skip("these GPUs cannot access each other's memory")
    with torch.cuda.device(1):
        # cudaDeviceEnablePeerAccess / Disable from cuda:1 to cuda:0's memory;
        # "already enabled" (704) and "not enabled" (705) are the states we want
        err = lib.cudaDeviceEnablePeerAccess(0, 0) if peer else lib.cudaDeviceDisablePeerAccess(0)
        assert err in (0, 704, 705), err
        lib.cudaGetLastError()
    x = torch.randn(8 * MiB, device="cuda:0")
    uvm.prefetch(x, "cuda:0")
    torch.cuda.synchronize(0)
    want = (x.double() * 2).sum().item()
    assert range_attribute(x, LAST_PREFETCH_LOCATION) == 0
    on1 = x.to("cuda:1")                              # the same memory, seen from cuda:1
    assert on1.data_ptr() == x.data_ptr()
    with torch.cuda.device(1):
        got = (on1.double() * 2).sum().item()
    assert got == want


def test_offload_and_prefetching_on_cuda1_while_cuda0_works(uvm):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])   # 32 MiB
    want = model(torch.ones(4, 1024)).detach()
    handle = uvm.offload(model, budget=12 * MiB, device="cuda:1", mode="prefetch")   # slots
    busy = torch.randn(4096, 4096, device="cuda:0")
    before0 = uvm.residency_stats("cuda:0")["prefetched_bytes"]
    seen = []
    hook = model[5].register_forward_pre_hook(
        lambda m, args: seen.append((memory_type(m.weight), memory_device(m.weight))))
    try:
        with torch.cuda.device(0):
            for _ in range(8):
                busy = busy @ busy / 4096             # unrelated work on cuda:0
        with torch.no_grad():
            got = model(torch.ones(4, 1024, device="cuda:1"))
        torch.cuda.synchronize(1)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
        assert seen and all(device == 1 for _, device in seen), seen      # slots on cuda:1
        s1 = uvm.residency_stats("cuda:1")
        assert 0 < s1["resident_bytes.peak"] <= 12 * MiB
        assert uvm.residency_stats("cuda:0")["prefetched_bytes"] == before0   # nothing on cuda:0
        data = torch.arange(16 * MiB, dtype=torch.float32)               # 64 MiB of batches
        for batch in uvm.prefetching(list(data.split(4 * MiB)), "cuda:1"):
            torch.cuda.current_stream(1).synchronize()
            assert batch.device == torch.device("cuda", 1)
            assert range_attribute(batch, LAST_PREFETCH_LOCATION) == 1   # never cuda:0
    finally:
        hook.remove()
        handle.undo()
        uvm.evict("cuda:1")
