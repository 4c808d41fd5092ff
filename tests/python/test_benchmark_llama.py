"""benchmarks/offload_llama.py on the CPU (issue 35): the script starts, its
model builder (meta device, to_empty, filled in place) gives the same weights
every time and the model an ordinary build gives with them (the rotary
embedding's inv_freq included), accelerate's device map covers the model
within the budget, and the report's arithmetic (link limit, ratios, token
checks) from given runs. No GPU; the builder tests skip without transformers."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import offload_llama as L  # noqa: E402

SCRIPT = os.path.join(ROOT, "benchmarks", "offload_llama.py")


def test_the_script_starts_and_lists_its_variants():
    p = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "--tiny" in p.stdout and "torch_uvm_4GiB_b8" in p.stdout and "accelerate_8GiB" in p.stdout
    p = subprocess.run([sys.executable, SCRIPT, "--variants", "torch_uvm_3GiB_b1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "unknown variants ['torch_uvm_3GiB_b1']" in p.stderr


def test_variant_names_parse():
    default, extra = L.variants()
    assert default[:2] == ["pinned_rate", "resident"] and len(default) == 10   # 2 under gpu_memory
    assert L.parse("torch_uvm_4GiB_b8") == ("torch_uvm", 4, (8,))
    assert L.parse("accelerate_8GiB") == ("accelerate", 8, L.BATCHES)
    assert L.parse("accelerate_pinned_4GiB") == ("accelerate_pinned", 4, L.BATCHES)
    assert L.parse("resident") == ("resident", None, L.BATCHES)
    assert all(L.parse(v) for v in default[1:] + extra)
    assert L.parse("torch_uvm_4GiB_sweep") == ("torch_uvm", 4, L.SWEEP)
    assert L.parse("resident_sweep") == ("resident", None, L.SWEEP)
    assert "torch_uvm_4GiB_sweep" in extra and "resident_sweep" in extra


def _rotaries(model):
    return {n: m for n, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")}


def test_the_builder_gives_the_same_model_as_an_ordinary_build():
    pytest.importorskip("transformers")
    from transformers import LlamaForCausalLM
    a, b = L.build(tiny=True, fill="cpu"), L.build(tiny=True, fill="cpu")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)                  # seeded: equal builds
    assert all(p.dtype == torch.bfloat16 for p in a.parameters())
    assert L.weights_bytes(a.config) == sum(p.numel() * 2 for p in a.parameters())
    norms = [p for n, p in a.named_parameters() if "norm" in n]
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms)
    big = [p for p in a.parameters() if p.dim() == 2]
    assert all(0.015 < p.float().std().item() < 0.025 for p in big)
    # the non-persistent buffers (inv_freq) are what a fresh model computes
    ordinary = LlamaForCausalLM(L.llama_config(True))
    fresh, built = _rotaries(ordinary), _rotaries(a)
    assert fresh.keys() == built.keys() and fresh
    for name in fresh:
        for buf, value in fresh[name].named_buffers():
            got = dict(built[name].named_buffers())[buf]
            assert torch.isfinite(got).all() and torch.equal(got, value), (name, buf)
    # and with the same weights, the ordinary build computes the same logits
    for p in ordinary.parameters():
        p.data = p.data.to(torch.bfloat16)
    ordinary.load_state_dict(sa)
    ids = torch.randint(0, a.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, ordinary.eval()(ids).logits)
    assert torch.equal(L.generate(a, ids, 3), L.generate(b, ids, 3))


def test_the_builder_refuses_non_persistent_buffers_it_cannot_make():
    pytest.importorskip("transformers")
    model = L.build(tiny=True, fill="cpu")
    model.model.layers[0].register_buffer("mask", torch.zeros(2), persistent=False)
    with pytest.raises(RuntimeError, match=r"model\.layers\.0\.mask"):
        L.fix_non_persistent(model, model.config)


def test_accelerates_map_covers_the_model_within_the_budget():
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from accelerate.utils import check_device_map
    model = L.build(tiny=True, fill="cpu")
    layer = sum(p.numel() * 2 for p in model.model.layers[0].parameters())
    for gib in L.BUDGETS_GIB:
        budget = L.budget_bytes(gib, tiny=True)
        device_map, on_gpu, gpu_bytes = L.accelerate_map(model, budget)
        check_device_map(model, device_map)
        assert gpu_bytes <= budget < gpu_bytes + layer              # as many layers as fit
        assert L.layers_on_gpu(device_map, 2) == on_gpu
        assert device_map["lm_head"] == 0 and device_map["model.embed_tokens"] == 0
    # the 7B (on the meta device): 9 and 19 of its 32 layers of 405 MB fit beside 524 MB
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        seven = LlamaForCausalLM(L.llama_config()).to(torch.bfloat16)
    assert sum(p.numel() * 2 for p in seven.parameters()) == L.weights_bytes(seven.config)
    assert [L.accelerate_map(seven, L.budget_bytes(g))[1] for g in L.BUDGETS_GIB] == [9, 19]
    assert L.layers_on_gpu({"": 0}, 32) == 32 and L.layers_on_gpu({"model.layers": "cpu"}, 32) == 0


def _run(tps, tokens, batch_first=True, **extra):
    batch = {"tokens_per_s": tps, "times_s": [1.0], "first_token_s": 0.5,
             "first_after_placement": batch_first, "first_scores_sha1": "x" if tokens else "y",
             "gpu_peak_timed_bytes": 5 << 30, "tokens": [[1, 2]] if tokens else [[1, 3]]}
    return {"build_s": 9.0, "weights_bytes": 14 << 30, "place_s": 3.0, "gpu_peak_run_bytes": 6 << 30,
            "torch_reserved_peak_bytes": 4 << 30, "torch_allocated_peak_bytes": 4 << 30,
            "host_peak_bytes": 30 << 30, "batches": {}, **extra, "_batch": batch}


def _process(batches, **kw):
    r = None
    for b, (tps, tokens) in batches.items():
        one = _run(tps, tokens, **kw)
        if r is None:
            r = one
        r["batches"][str(b)] = one.pop("_batch")
    r.pop("_batch", None)
    return r


def test_the_report_computes_the_limit_and_the_ratios(tmp_path, capsys):
    budget = 4 << 30                  # weights 14 GiB: 10 GiB must cross per token
    runs = {
        "pinned_rate": [{"h2d_gbps": 50.0, "d2h_gbps": 50.0}, {"h2d_gbps": 40.0, "d2h_gbps": 40.0}],
        "resident": [_process({1: (30.0, True), 8: (200.0, True)}, budget_bytes=None)] * 2,
        "torch_uvm_4GiB_b1": [_process({1: (4.0, True)}, budget_bytes=budget, mode="prefetch",
                                       resident_units=10, units=100, resident_bytes_peak=budget,
                                       slot_reserved_peak_bytes=1 << 30), None],
        "torch_uvm_4GiB_b8": [_process({8: (32.0, True)}, budget_bytes=budget, mode="prefetch")] * 2,
        "accelerate_4GiB": [_process({1: (1.0, False), 8: (8.0, True)}, budget_bytes=budget,
                                     layers_on_gpu=9, auto_map_layers_on_gpu=8,
                                     weights_on_gpu_bytes=budget - 1)] * 2,
    }
    compared = L.report(runs, str(tmp_path))
    out = capsys.readouterr().out
    limit = 50e9 / (10 << 30)          # round 1's limit at batch 1, tokens/s
    key = "torch_uvm 4GiB, batch 1, tokens/s / link limit (10240 MiB a token at the pinned rate)"
    assert compared[key]["ratios"] == pytest.approx([4.0 / limit])   # round 2 failed: left out
    assert compared[key]["target"] == 0.85
    b8 = compared["torch_uvm 4GiB, batch 8, tokens/s / link limit (10240 MiB a token at the "
                  "pinned rate)"]
    assert b8["ratios"] == pytest.approx([32.0 / (8 * limit), 32.0 / (8 * limit * 0.8)])
    vs = compared["torch_uvm 4GiB, batch 8, torch_uvm / accelerate, tokens/s"]
    assert vs["ratios"] == [4.0, 4.0] and vs["met"]
    assert compared["torch_uvm 4GiB, batch 1, torch_uvm / accelerate, tokens/s"]["ratios"] == [4.0]
    saved = json.load(open(tmp_path / "offload_llama.json"))
    assert saved["tables"]["accelerate 4GiB, batch 1"]["same_tokens"] is False
    assert saved["tables"]["accelerate 4GiB, batch 1"]["same_first_scores"] is False
    assert saved["tables"]["torch_uvm 4GiB, batch 8"]["same_tokens"] is True
    assert saved["tables"]["accelerate 4GiB, batch 8"]["first_after_placement"] is True
    assert "| torch uvm 4GiB" not in out and "| torch_uvm 4GiB (prefetch) | 1 | 4.00" in out
    assert "| accelerate 4GiB | 1 | 1.00 (1.00–1.00) |" in out and "False (False)" in out


def test_the_driver_runs_the_chosen_variants_interleaved(tmp_path, monkeypatch, capsys):
    calls = []

    def spawn(script, timeout, **args):
        calls.append(args)
        if args["variant"] == "pinned_rate":
            return {"h2d_gbps": 50.0, "d2h_gbps": 50.0}
        kind, gib, batches = L.parse(args["variant"])
        return _process({b: (2.0 * b, True) for b in batches},
                        budget_bytes=None if gib is None else gib << 30)

    monkeypatch.setattr(L.method, "spawn", spawn)
    L.main(["--rounds", "2", "--variants", "torch_uvm_4GiB_b1", "--out", str(tmp_path), "--tiny"])
    # the rate and the reference are kept with any choice
    assert [c["variant"] for c in calls] == ["pinned_rate", "resident", "torch_uvm_4GiB_b1"] * 2
    assert all(c["tiny"] == 1 for c in calls)
    saved = json.load(open(tmp_path / "offload_llama_tiny.json"))
    assert saved["tiny"] is True and len(saved["runs"]["torch_uvm_4GiB_b1"]) == 2
    assert "| torch_uvm 4GiB | 1 | 2.00" in capsys.readouterr().out


def test_the_sweep_holds_the_limit_to_the_batch_and_checks_tokens_at_each(tmp_path, capsys):
    """Throughput generation: each swept batch's link limit is the batch
    times the limit per token step, its tokens are checked against all
    resident's at the same batch, and the plot gains the sweep's panel."""
    budget = 4 << 30
    runs = {
        "pinned_rate": [{"h2d_gbps": 50.0, "d2h_gbps": 50.0}],
        "resident": [_process({1: (30.0, True), 8: (200.0, True)}, budget_bytes=None)],
        "resident_sweep": [_process({b: (25.0 * b, True) for b in L.SWEEP}, budget_bytes=None)],
        "torch_uvm_4GiB_sweep": [_process({32: (150.0, True), 128: (600.0, True),
                                           512: (2300.0, True), 1024: (4000.0, False)},
                                          budget_bytes=budget, mode="prefetch")],
    }
    compared = L.report(runs, str(tmp_path))
    out = capsys.readouterr().out
    per_step = 50e9 / (10 << 30)
    for b, tps in ((32, 150.0), (1024, 4000.0)):
        key = (f"torch_uvm 4GiB, batch {b}, tokens/s / link limit (10240 MiB a token at the "
               "pinned rate)")
        assert compared[key]["ratios"] == pytest.approx([tps / (b * per_step)])
        assert compared[f"torch_uvm 4GiB, batch {b}, tokens/s / all resident's"]["ratios"] == \
            pytest.approx([tps / (25.0 * b)])
    saved = json.load(open(tmp_path / "offload_llama.json"))
    assert saved["tables"]["torch_uvm 4GiB, batch 512"]["same_tokens"] is True
    assert saved["tables"]["torch_uvm 4GiB, batch 1024"]["same_tokens"] is False
    assert saved["sweep"] == list(L.SWEEP)
    assert "| torch_uvm 4GiB (prefetch) | 1024 | 4000.00" in out


def test_a_bound_variant_reports_the_whole_process_against_its_gpu_memory(tmp_path, capsys):
    """torch_uvm_bound_5GiB_b1: offload under gpu_memory=5 GiB. The report
    adds what the process held at CUDA's start to the run's peak, and sets
    it beside the bound and the budget chosen; the link limit is the
    chosen budget's."""
    assert L.parse("torch_uvm_bound_5GiB_b8") == ("torch_uvm_bound", 5, (8,))
    assert "torch_uvm_bound_5GiB_b1" in L.variants()[0]
    chosen = 3 << 30
    runs = {
        "pinned_rate": [{"h2d_gbps": 50.0, "d2h_gbps": 50.0}],
        "resident": [_process({1: (30.0, True), 8: (200.0, True)}, budget_bytes=None)],
        "torch_uvm_bound_5GiB_b1": [_process({1: (4.0, True)}, budget_bytes=chosen,
                                             bound_bytes=5 << 30, mode="prefetch",
                                             process_gpu_at_start_bytes=1 << 29)],
    }
    compared = L.report(runs, str(tmp_path))
    out = capsys.readouterr().out
    assert "gpu_memory 5.00 GiB: the process's peak 6.50 GiB (CUDA's start 0.50 + the run's " \
        "6.00), the budget chosen 3.00 GiB" in out
    key = "torch_uvm_bound 5GiB, batch 1, tokens/s / link limit (11264 MiB a token at the " \
        "pinned rate)"
    assert compared[key]["ratios"] == pytest.approx([4.0 / (50e9 / (11 << 30))])
    saved = json.load(open(tmp_path / "offload_llama.json"))
    row = saved["tables"]["torch_uvm_bound 5GiB, batch 1"]
    assert row["process_gpu_whole_peak_bytes"] == (1 << 29) + (6 << 30)
    assert row["bound_bytes"] == 5 << 30 and row["budget_bytes"] == chosen
