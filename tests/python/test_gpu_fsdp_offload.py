"""FSDP2's CPUOffloadPolicy on the GPU, each param group stepped on
torch_uvm's host worker in the backward (torch_uvm.fsdp.step_in_backward),
against FSDP2's own step after the backward: the same losses and weights,
bit for bit (the worker waits for each gradient's copy home), stepping the
DTensors or their local shards (on_local_shards). One rank here
(torchrun, one GPU); two in test_gpu_multigpu.py; on the CPU in
test_multigpu_script.py."""
import json
import os

import pytest

from conftest import ROOT, gpu, multigpu, torchrun

TRAIN = os.path.join(ROOT, "tests", "multigpu", "train_ranks.py")


def both(tmp_path, nproc: int) -> dict:
    runs = {}
    for mode in ("fsdp2_offload", "fsdp2_offload_steps", "fsdp2_offload_local_steps"):
        out = tmp_path / f"{mode}-{nproc}.json"
        r = torchrun(TRAIN, "--mode", mode, "--uvm", "0", "--out", str(out), nproc=nproc)
        assert r.returncode == 0, f"{mode}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
        runs[mode] = json.loads(out.read_text())["ranks"]
    return runs


@pytest.mark.parametrize("nproc", [pytest.param(1, marks=gpu), pytest.param(2, marks=multigpu)])
def test_fsdp2s_offload_stepped_in_backward_equals_its_own_step(tmp_path, nproc):
    runs = both(tmp_path, nproc)
    theirs = runs["fsdp2_offload"]
    for ours in (runs["fsdp2_offload_steps"], runs["fsdp2_offload_local_steps"]):
        assert [x["losses"] for x in ours] == [x["losses"] for x in theirs]
        assert [x["params_sha1"] for x in ours] == [x["params_sha1"] for x in theirs]
