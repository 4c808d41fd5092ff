"""benchmarks/load_llama.py on the CPU (issue 35, points 1 and 5): the
report's arithmetic from given runs: times to the first token against
resident's and against the anchors, paired round by round, the link limit
from each round's rate, tokens checked against resident's, a failed run
shown as such. No GPU."""
import json
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import load_llama as L  # noqa: E402

GiB = 1 << 30


def _run(load, first, host, tokens=(1, 2, 3)):
    return {"load_s": load, "load_parts_s": {"model_s": 0.5, "offload_s": load - 1.0},
            "first_token_s": first, "to_first_token_s": load + first,
            "tokens_per_s": 5.0, "tokens": list(tokens), "host_base_bytes": GiB,
            "host_peak_bytes": host, "host_after_bytes": host / 2, "gpu_peak_bytes": 4 * GiB,
            "weights_bytes": 10 * GiB, "budget_bytes": 4 * GiB}


def test_the_report_pairs_rounds_and_checks_tokens(tmp_path, capsys):
    runs = {
        "checkpoint": [{"written": True}, {"written": False}],
        "pinned_rate": [{"h2d_gbps": 50.0, "d2h_gbps": 50.0, "pin_gbps_1": 2.0, "pin_gbps_4": 3.0,
                         "read_gbps_1": 6.0, "read_gbps_4": 12.0},
                        {"h2d_gbps": 40.0, "d2h_gbps": 40.0}],
        "resident": [_run(4.0, 1.0, GiB), _run(5.0, 1.0, GiB)],
        "hf_then_torch_uvm": [_run(9.0, 1.0, 20 * GiB), _run(11.0, 1.0, 21 * GiB)],
        "torch_uvm_checkpoint": [_run(6.0, 1.5, 11 * GiB), _run(7.0, 2.0, 10 * GiB, (1, 2, 4))],
        "accelerate": [None, _run(18.0, 2.0, 30 * GiB)],
    }
    compared = L.report(runs, str(tmp_path))
    out = capsys.readouterr().out
    saved = json.load(open(tmp_path / "load_llama.json"))
    assert saved["link_limit_s"] == pytest.approx([10 * GiB / 50e9, 10 * GiB / 40e9])
    mine = saved["tables"]["torch_uvm_checkpoint"]
    assert mine["same_tokens"] is False and mine["host_peak_bytes"] == 11 * GiB
    assert saved["tables"]["hf_then_torch_uvm"]["same_tokens"] is True
    assert compared["torch_uvm_checkpoint: time to the first token / resident's"]["ratios"] == \
        pytest.approx([7.5 / 5.0, 9.0 / 6.0])
    assert compared["torch_uvm_checkpoint: time to the first token / hf_then_torch_uvm's"][
        "ratios"] == pytest.approx([7.5 / 10.0, 9.0 / 12.0])
    assert compared["torch_uvm_checkpoint: time to the first token / accelerate's"][
        "ratios"] == pytest.approx([9.0 / 20.0])       # its first round failed
    assert "| accelerate | 18.0 | 17.0 | 2.00 | 20.0 | 3.33 | 30.00 | 15.00 | 4.00 | True |" in out
    assert "pinning 2.0 GB/s on one thread, 3.0 on four; reading the files from the page " \
        "cache 6.0 GB/s on one thread, 12.0 on four; W at the pinning rate: 5.4 s" in out
    assert "resident: time to the first token" not in json.dumps(compared)
    assert (tmp_path / "load_llama.png").exists() or "matplotlib" in out
