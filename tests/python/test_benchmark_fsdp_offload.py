"""benchmarks/fsdp_offload.py on two gloo CPU ranks with the tiny Llama: each
variant launches through torchrun, the table and JSON come out, and
torch_uvm's host steps give FSDP2's own losses on every rank (no GPU)."""
import json
import os
import sys

import pytest

pytest.importorskip("transformers")     # (the ranks build the tiny Llama)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import fsdp_offload  # noqa: E402


def test_the_offload_benchmark_runs_two_cpu_ranks_and_checks_the_twins(tmp_path, capsys):
    fsdp_offload.main(["--gpus", "2", "--cpu", "--shape", "tiny", "--rounds", "1",
                       "--variants", "fsdp2_cpu_offload,fsdp2_cpu_offload_uvm_steps",
                       "--out", str(tmp_path)])
    saved = json.load(open(tmp_path / "fsdp_offload-2gpu-tiny.json"))
    table = saved["table"]
    assert set(table) == {"fsdp2_cpu_offload", "fsdp2_cpu_offload_uvm_steps"}
    assert table["fsdp2_cpu_offload_uvm_steps"]["same_losses_as_twin"] is True
    run = saved["runs"]["fsdp2_cpu_offload"][0]
    assert run["world"] == 2 and [r["rank"] for r in run["ranks"]] == [0, 1]
    assert "fsdp2_cpu_offload_uvm_steps / fsdp2_cpu_offload, s a step" in saved["comparisons"]
    assert "| fsdp2_cpu_offload_uvm_steps |" in capsys.readouterr().out
    assert run["shape"] == "tiny" and all(r["threads"] >= 1 for r in run["ranks"])
    fsdp_offload.main(["--gpus", "2", "--cpu", "--shape", "tiny", "--rounds", "1", "--append",
                       "--variants", "fsdp2_cpu_offload",
                       "--out", str(tmp_path)])          # a second round of one, added
    again = json.load(open(tmp_path / "fsdp_offload-2gpu-tiny.json"))
    assert len(again["runs"]["fsdp2_cpu_offload"]) == 2 and len(again["rates"]) == 2
    kept = again["runs"]["fsdp2_cpu_offload_uvm_steps"]    # not run: its first round kept
    assert len(kept) == 2 and kept[0] is not None and kept[1] is None
    assert again["table"]["fsdp2_cpu_offload_uvm_steps"]["s_per_step"]["n"] == 1


def test_a_twin_whose_losses_differ_is_reported_so(tmp_path):
    def run(losses):
        return {"world": 1, "s_per_step": 1.0, "weights_bytes": 1 << 30,
                "tokens_per_step_per_rank": 4096,
                "ranks": [{"rank": 0, "losses": losses, "process_gpu_memory": None,
                           "host_peak_bytes": 1 << 30}]}
    runs = {"fsdp2_cpu_offload": [run([2.0, 1.5])],
            "fsdp2_cpu_offload_uvm_steps": [run([2.0, 1.25])]}
    fsdp_offload.report(runs, [None], 1, str(tmp_path), "3b")
    table = json.load(open(tmp_path / "fsdp_offload-1gpu-3b.json"))["table"]
    assert table["fsdp2_cpu_offload_uvm_steps"]["same_losses_as_twin"] is False


def test_the_host_steps_are_compared_with_deepspeeds_offload_round_by_round(tmp_path):
    def run(seconds):
        return {"world": 1, "s_per_step": seconds, "weights_bytes": 1 << 30,
                "tokens_per_step_per_rank": 4096,
                "ranks": [{"rank": 0, "losses": [2.0], "process_gpu_memory": None,
                           "host_peak_bytes": 1 << 30}]}
    runs = {"fsdp2_cpu_offload_bf16_uvm_steps": [run(1.0), run(1.5)],
            "deepspeed_zero3_offload_bf16": [run(2.0), None]}
    fsdp_offload.report(runs, [None, None], 1, str(tmp_path), "3b")
    compared = json.load(open(tmp_path / "fsdp_offload-1gpu-3b.json"))["comparisons"]
    ratio = compared["fsdp2_cpu_offload_bf16_uvm_steps / deepspeed_zero3_offload_bf16, s a step"]
    assert ratio["ratios"] == [0.5] and ratio["n"] == 1      # (a round without it: not paired)

