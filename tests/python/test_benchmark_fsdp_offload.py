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
    for rank in run["ranks"]:          # each step split in three, adding up to its time
        assert [sum(p.values()) for p in rank["phases"]] == pytest.approx(rank["times_s"],
                                                                        rel=1e-2)
    assert set(table["fsdp2_cpu_offload"]["phases"]) == {"forward_s", "backward_s", "step_s"}
    fsdp_offload.main(["--gpus", "2", "--cpu", "--shape", "tiny", "--rounds", "1", "--append",
                       "--variants", "fsdp2_cpu_offload", "--profile",
                       "--out", str(tmp_path)])          # a second round of one, added
    again = json.load(open(tmp_path / "fsdp_offload-2gpu-tiny.json"))
    assert len(again["runs"]["fsdp2_cpu_offload"]) == 2 and len(again["rates"]) == 2
    kept = again["runs"]["fsdp2_cpu_offload_uvm_steps"]    # not run: its first round kept
    assert len(kept) == 2 and kept[0] is not None and kept[1] is None
    assert again["table"]["fsdp2_cpu_offload_uvm_steps"]["s_per_step"]["n"] == 1
    [profiled, _] = again["table"]["fsdp2_cpu_offload"]["profiled_steps"]   # (each rank's)
    assert profiled["wall_s"] > 0 and profiled["to_gpu"]["copies"] == 0     # (no GPU here)


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


def test_a_profiled_steps_gpu_time_is_summed_from_its_trace():
    """profile_summary on a hand-made trace: copies by direction, and the
    union of the copies' and the kernels' spans (overlaps counted once),
    NCCL's apart."""
    trace = {"traceEvents": [
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 0, "dur": 1000,
         "args": {"bytes": 4_000_000}},
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 5000, "dur": 1000,
         "args": {"bytes": 2_000_000}},
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 500, "dur": 1000,
         "args": {"bytes": 3_000_000}},                     # another stream's, overlapping
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 0, "dur": 500,
         "args": {"bytes": 1_000_000}},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 0, "dur": 900,
         "args": {"bytes": 9}},
        {"cat": "kernel", "name": "gemm", "ts": 0, "dur": 300},
        {"cat": "kernel", "name": "softmax", "ts": 200, "dur": 300},      # overlaps: 0-500
        {"cat": "kernel", "name": "gemm", "ts": 1000, "dur": 100},
        {"cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 0, "dur": 2000},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99999},
        {"cat": "cpu_op", "name": "aten::_fused_adamw_", "ts": 4800, "dur": 400},
        {"cat": "cpu_op", "name": "aten::_fused_adamw_", "ts": 5100, "dur": 500},  # 4800-5600
        {"ph": "M", "name": "process_name"}]}
    p = fsdp_offload.profile_summary(trace, 0.01)
    beside = p["to_gpu"].pop("beside_adamw")
    assert p["to_gpu"] == {"copies": 3, "bytes": 9_000_000, "seconds": 0.0025, "gbps": 3.6}
    # the copy at 5000-6000 ran 600 of its 1000 us beside the AdamW; the others none
    assert beside == {"copies": 1, "bytes": 2_000_000, "seconds": 0.001, "gbps": 2.0}
    assert p["home"].pop("beside_adamw")["copies"] == 0
    assert p["home"] == {"copies": 1, "bytes": 1_000_000, "seconds": 0.0005, "gbps": 2.0}
    assert p["compute_s"] == pytest.approx(0.0006) and p["nccl_s"] == pytest.approx(0.002)
    assert p["adamw_s"] == pytest.approx(0.0008) and p["wall_s"] == 0.01

