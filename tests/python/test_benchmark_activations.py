"""benchmarks/offload_activations.py on the CPU (issue 35, point 4): the
report's arithmetic from given runs: the link time of the bytes torch_uvm
sent (home and back, at each round's rates), "covered" where resident's step
is at least that long, the target only there, the ratios paired round by
round, an out-of-memory length shown as such. No GPU."""
import json
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import offload_activations as A  # noqa: E402

GiB = 1 << 30


def _run(secs, sent=None, oom=(), norm=1.0, budget=0):
    seqs = {}
    for seq, s in secs.items():
        seqs[str(seq)] = {"s_per_step": s, "times_s": [s], "tokens_per_s": seq / s,
                          "losses": [10.0], "grad_norm": norm,
                          "gpu_peak_timed_bytes": 5 * GiB, "torch_reserved_peak_bytes": 4 * GiB}
        if sent is not None:
            seqs[str(seq)]["sent_bytes_per_step"] = sent[seq]
    for seq in oom:
        seqs[str(seq)] = {"oom": "CUDA out of memory"}
    return {"weights_bytes": 4 * GiB, "seqs": seqs, "cap_bytes": 24 * GiB,
            "host_peak_bytes": 30 * GiB, "activation_budget_bytes": budget}


def test_the_report_marks_where_compute_covers_the_link(tmp_path, capsys):
    short, long = A.SEQS["full"][0], A.SEQS["full"][-1]
    sent = {short: 10 * GiB, long: 2 * GiB}
    runs = {
        "pinned_rate": [{"h2d_gbps": 50.0, "d2h_gbps": 40.0}] * 2,
        "resident": [_run({short: 0.1, long: 1.0}), _run({short: 0.1, long: 1.0})],
        "resident_capped": [_run({short: 0.1}, oom=[long])] * 2,
        "torch_uvm": [_run({short: 0.6, long: 1.1}, sent, norm=1.5),
                      _run({short: 0.5, long: 1.3}, sent, norm=1.5)],
        "save_on_cpu": [_run({short: 1.2, long: 2.6}), None],
        "torch_uvm_8GiB": [_run({short: 0.2, long: 1.0}, {short: 2 * GiB, long: 0},
                                budget=8 * GiB)] * 2,
    }
    compared = A.report(runs, str(tmp_path), tiny=False, scenario="full")
    out = capsys.readouterr().out
    link_long = 2 * GiB / 40e9 + 2 * GiB / 50e9          # 0.097 s: resident's 1.0 s covers it
    saved = json.load(open(tmp_path / "offload_activations_full.json"))
    row = saved["tables"][f"torch_uvm, {long}"]
    assert row["covered"] is True and row["link_s"]["median"] == pytest.approx(link_long)
    assert saved["tables"][f"torch_uvm, {short}"]["covered"] is False   # 0.48 s of copies
    x = compared[f"torch_uvm, {long}: s per step / resident's"]
    assert x["ratios"] == pytest.approx([1.1, 1.3]) and x["target"] == 1.2
    assert compared[f"torch_uvm, {short}: s per step / resident's"]["target"] is None
    assert compared[f"torch_uvm, {long}: s per step / save_on_cpu's"]["ratios"] == \
        pytest.approx([1.1 / 2.6])                       # its second round failed
    assert row["grad_norm_minus_resident"] == pytest.approx(0.5)
    budgeted = saved["tables"][f"torch_uvm_8GiB, {short}"]    # 10 GiB saved, 8 may stay
    assert budgeted["least_bytes_per_step"] == 2 * GiB and budgeted["covered"] is True  # 0.097 s
    assert saved["tables"][f"torch_uvm_8GiB, {long}"]["least_bytes_per_step"] == 0
    assert saved["tables"][f"torch_uvm_8GiB, {long}"]["covered"] is True
    assert compared[f"torch_uvm_8GiB, {long}: s per step / resident's"]["target"] == 1.2
    assert f"| resident_capped | {long} | out of memory |" in out
    assert saved["tables"][f"resident_capped, {long}"] == {"oom": True}
    assert (tmp_path / "offload_activations_full.png").exists() or "matplotlib missing" in out
