"""benchmarks/offload_lora.py on the CPU (issue 35): the report's arithmetic
from given runs: the link limit (the parameters less the budget, to the GPU
in both passes), the bound max(link limit, all resident), the ratios paired
round by round, the losses checked against all-resident's. No GPU."""
import json
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import offload_lora as L  # noqa: E402

GiB = 1 << 30


def _run(secs, losses, **extra):
    """One process's result: {batch: s per step}, the same losses at each batch."""
    return {"weights_bytes": 14 * GiB, "trainable_bytes": GiB // 8, "build_s": 20.0,
            "place_s": 5.0, "first_step_s": 1.5, "gpu_peak_run_bytes": 9 * GiB,
            "torch_reserved_peak_bytes": 8 * GiB, "host_peak_bytes": 15 * GiB,
            "tokens_per_step": {str(b): b * L.SEQ for b in L.BATCHES},
            "batches": {str(b): {"s_per_step": s, "times_s": [s], "tokens_per_s": b * L.SEQ / s,
                                 "losses": losses, "gpu_peak_timed_bytes": 6 * GiB}
                        for b, s in secs.items()}, **extra}


def test_the_report_computes_the_limits_and_the_ratios(tmp_path, capsys):
    same, other = [11.0, 10.5, 10.0], [11.0, 10.4, 10.0]
    runs = {
        "pinned_rate": [{"h2d_gbps": 50.0, "d2h_gbps": 50.0}, {"h2d_gbps": 40.0, "d2h_gbps": 40.0}],
        "resident": [_run({1: 0.5, 4: 0.7}, same)] * 2,
        "torch_uvm_4GiB": [_run({1: 0.8, 4: 0.9}, same, budget_bytes=4 * GiB),
                           _run({1: 1.0, 4: 0.9}, other, budget_bytes=4 * GiB)],
        "fsdp2_cpu_offload": [_run({1: 1.6, 4: 1.8}, other), None],
    }
    for r in runs["torch_uvm_4GiB"]:
        r["batches"]["1"]["to_gpu_bytes_per_step"] = 30 * GiB      # its books: 1.5x the least
    compared = L.report(runs, str(tmp_path), tiny=False)
    out = capsys.readouterr().out
    # 10 GiB not resident, brought in both passes: 20 GiB at 50 and at 40 GB/s
    limits = [20 * GiB / 50e9, 20 * GiB / 40e9]
    x = compared["torch_uvm_4GiB, batch 1: s per step / link limit"]
    assert x["ratios"] == pytest.approx([0.8 / limits[0], 1.0 / limits[1]])
    bound = compared["torch_uvm_4GiB, batch 1: s per step / max(link limit, all resident)"]
    assert bound["ratios"] == pytest.approx([0.8 / max(limits[0], 0.5), 1.0 / max(limits[1], 0.5)])
    assert bound["target"] == 1.3
    vs = compared["torch_uvm_4GiB, batch 4: s per step / fsdp2_cpu_offload's"]
    assert vs["ratios"] == pytest.approx([0.9 / 1.8])              # round 2 of FSDP2 failed
    saved = json.load(open(tmp_path / "offload_lora.json"))
    row = saved["tables"]["torch_uvm_4GiB, batch 1"]
    assert row["same_losses"] is False and row["first_loss_same"] is True
    assert row["losses_max_abs_difference"] == pytest.approx(0.1)
    assert row["least_bytes_per_step"] == 20 * GiB and row["to_gpu_bytes_per_step"] == 30 * GiB
    assert "| 30.00 (20.00) |" in out
    assert saved["tables"]["resident, batch 4"]["link_limit_tokens_per_s"] is None
    assert "| torch_uvm_4GiB | 1 |" in out and "| fsdp2_cpu_offload | 4 |" in out
    assert (tmp_path / "offload_lora.png").exists() or "matplotlib missing" in out


def test_the_variants_are_named_for_their_budgets():
    assert L.VARIANTS[:2] == ["pinned_rate", "resident"]
    assert [v for v in L.VARIANTS if v.startswith("torch_uvm")] == \
        [f"torch_uvm_{g}GiB" for g in L.BUDGETS_GIB] + [f"torch_uvm_bound_{L.BOUND_GIB}GiB"]
    assert "qlora_nf4" in L.VARIANTS


def test_a_variants_suffix_names_the_units_it_streams():
    assert L.units_option("torch_uvm_4GiB") == "" and L.unit_classes("") is None
    assert L.units_option("torch_uvm_0.5GiB_lora") == "lora"
    assert L.units_option("torch_uvm_1GiB_layers") == "layers"
    assert L.unit_classes("layers") == ("LlamaDecoderLayer",)
    assert all(L.units_option(v) in L.UNITS for v in L.CURVE if not v.endswith("GiB"))


def test_a_bound_variant_reports_the_whole_process_against_its_gpu_memory(tmp_path, capsys):
    """torch_uvm_bound_6GiB: offload under gpu_memory; the report adds what
    the process held at CUDA's start to the run's peak, beside the bound
    and the budget chosen (whose link limit it is held to)."""
    same = [11.0, 10.5, 10.0]
    runs = {"pinned_rate": [{"h2d_gbps": 50.0, "d2h_gbps": 50.0}],
            "resident": [_run({1: 0.5, 4: 0.7}, same)],
            "torch_uvm_bound_6GiB": [_run({1: 0.8, 4: 0.9}, same, budget_bytes=GiB,
                                          bound_bytes=6 * GiB,
                                          process_gpu_at_start_bytes=GiB // 2)]}
    compared = L.report(runs, str(tmp_path), tiny=False)
    out = capsys.readouterr().out
    assert "gpu_memory 6.00 GiB: the process's peak 9.50 GiB (CUDA's start 0.50 + the run's " \
        "9.00), the budget chosen 1.00 GiB" in out
    x = compared["torch_uvm_bound_6GiB, batch 1: s per step / link limit"]
    assert x["ratios"] == pytest.approx([0.8 / (2 * 13 * GiB / 50e9)])
    row = json.load(open(tmp_path / "offload_lora.json"))["tables"]["torch_uvm_bound_6GiB, batch 4"]
    assert row["process_gpu_whole_peak_bytes"] == GiB // 2 + 9 * GiB
