"""The benchmark method (issue 12): paired ratios with their spread, targets
that a spread straddles, and the change between two result files. No GPU."""
import copy
import json
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import compare  # noqa: E402
import method   # noqa: E402


def test_ratios_pair_runs_of_the_same_round():
    s = method.ratio([2.0, 3.0, None, 5.0], [1.0, 1.0, 1.0, 2.0], target=2.4)
    assert s["ratios"] == [2.0, 3.0, 2.5]                 # the failed round is left out
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 2.0, 3.0, 3)
    assert s["straddles"] and not s["met"]
    assert "spread straddles the target" in method.describe("x", s)
    assert method.ratio([1.0], [None]) is None
    higher = method.ratio([30.0, 40.0], [1.0, 1.0], target=10, lower_is_better=False)
    assert higher["met"] and not higher["straddles"] and "| met |" in method.describe("y", higher)
    assert method.summarize([4.0, 1.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "n": 2}


def test_interleaving_runs_every_variant_once_per_round_the_order_rotated():
    order = []
    runs = method.interleaved(["pinned_rate", "a", "b", "c"], 3,
                              lambda v: order.append(v) or {"v": v})
    assert order == ["pinned_rate", "a", "b", "c", "pinned_rate", "b", "c", "a",
                     "pinned_rate", "c", "a", "b"]
    assert len(runs["a"]) == 3 and runs["b"][1] == {"v": "b"}


def write(path, comparisons):
    with open(path, "w") as f:
        json.dump({"machine": {"gpu": "test"}, "comparisons": comparisons}, f)


def test_compare_prints_the_change_of_each_ratio(tmp_path, capsys):
    old = {"t": method.ratio([1.0, 1.1], [1.0, 1.0], target=1.05),
           "same": method.ratio([2.0, 2.2], [1.0, 1.0]),
           "gone": method.ratio([1.0], [1.0])}
    new = {"t": method.ratio([2.0, 2.2], [1.0, 1.0], target=1.05),
           "same": method.ratio([2.1, 2.15], [1.0, 1.0])}
    write(tmp_path / "old.json", old)
    write(tmp_path / "new.json", new)
    compare.main([str(tmp_path / "old.json"), str(tmp_path / "new.json")])
    out = capsys.readouterr().out
    assert "| t | 1.05 (1–1.1) | 2.1 (2–2.2) | +100.0% | worse |" in out
    assert "| same |" in out and "within noise" in out
    assert "| gone |" in out and "only in one file" in out
    with open(tmp_path / "bad.json", "w") as f:
        json.dump({"runs": {}}, f)
    with pytest.raises(SystemExit, match="not written by benchmarks/method.py"):
        compare.main([str(tmp_path / "bad.json"), str(tmp_path / "new.json")])


def test_the_committed_larger_than_gpu_result_can_be_compared():
    """The committed result against itself changes nothing; against a copy
    whose first measured comparison is 30% slower and outside the old spread, that
    one is reported as a change beyond the noise, and only that one."""
    path = os.path.join(ROOT, "benchmarks", "results", "2026-11-24-h100", "larger_than_gpu.json")
    old = compare.load(path)
    rows = compare.changes(old, compare.load(path))
    measured = [name for name, _, _, change, _ in rows if change is not None]
    assert measured and all(change in (0, None) for _, _, _, change, _ in rows)
    new = copy.deepcopy(old)
    first = measured[0]
    slower = new["comparisons"][first]
    for key in ("median", "min", "max"):
        slower[key] = old["comparisons"][first]["max"] * 1.3 if key != "median" else \
            old["comparisons"][first]["median"] * 1.3
    slower["min"] = max(slower["min"], old["comparisons"][first]["max"] * 1.01)
    changed = {name: (change, noise) for name, _, _, change, noise in compare.changes(old, new)}
    assert changed[first][0] == pytest.approx(0.3) and changed[first][1] is False
    assert all(c in (0, None) for name, (c, _) in changed.items() if name != first)


def fake_run_one(calls):
    """run.run_one's stand-in: a result of each workload's shape, torch_uvm
    1.1x PyTorch's time in every round but the last (1.0x)."""
    def run_one(allocator, workload):
        calls.append((workload, allocator))
        slow = 1.0 if sum(1 for c in calls if c == (workload, allocator)) == 5 else 1.1
        k = slow if allocator.startswith("torch_uvm") else 1.0
        if workload == "alloc":
            return {"512": 1.0 * k, "mixed": 2.0 * k}
        if workload == "train":
            return {"mlp": 10.0 * k, "transformer": 20.0 * k}
        if workload == "moves_to_gpu":
            if allocator == "torch":
                return {str(1 << 20): {"pinned_copy": {"call_ms": 0.01, "ready_ms": 1.0,
                                                       "ready_sleeping_ms": 1.0}}}
            return {str(1 << 20): {allocator: {"call_ms": 0.01, "ready_ms": 1.2 * k,
                                               "ready_sleeping_ms": 1.2}}}
        if workload == "moves_to_cpu":
            name = "torch_uvm" if allocator == "torch_uvm" else "pinned_copy"
            return {str(64 << 20): {name: {"ms": 5.0, "GBps": 12.0}}}
        return None
    return run_one


def test_run_interleaves_rounds_and_reports_paired_ratios(tmp_path, monkeypatch, capsys):
    import run
    calls = []
    fake = fake_run_one(calls)
    monkeypatch.setattr(run, "run_group",
                        lambda allocator, workloads: {w: fake(allocator, w) for w in workloads})
    monkeypatch.setattr(run, "plot", lambda results, out: None)
    monkeypatch.setattr(run, "PLAN", {**run.PLAN, "train": ["torch", "torch_uvm"],
                                      "alloc": ["torch", "torch_uvm"],
                                      "moves_to_gpu": ["torch", "torch_uvm"]})
    monkeypatch.setattr(sys, "argv", ["run.py", "--only", "alloc,train,moves_to_gpu,moves_to_cpu",
                                      "--rounds", "5", "--out", str(tmp_path)])
    run.main()
    # A B, B A, ...: every round runs every variant once, the order rotated.
    per_round = len(calls) // 5
    assert sorted(calls[:per_round]) == sorted(calls[per_round:2 * per_round])
    assert calls[:per_round] != calls[per_round:2 * per_round] and len(calls) == 5 * per_round
    result = json.load(open(tmp_path / "results.json"))
    c = result["comparisons"]
    mlp = c["train mlp: torch_uvm / torch"]
    assert mlp["ratios"] == pytest.approx([1.1] * 4 + [1.0]) and mlp["target"] == 1.03
    assert mlp["median"] == pytest.approx(1.1) and mlp["straddles"] and not mlp["met"]
    assert c["alloc 512 B: torch_uvm / torch"]["target"] == 1.05
    ready = c["moves_to_gpu 1 MiB: torch_uvm data ready / pinned copy"]
    assert ready["median"] == pytest.approx(1.32) and ready["target"] == 1.1
    cpu = c["moves_to_cpu 64 MiB: torch_uvm GB/s, then a CPU read"]
    assert cpu["median"] == 12.0 and cpu["met"] is False
    assert set(result["machine"]) >= {"gpu", "driver", "torch", "cuda", "date"}
    assert "spread straddles the target" in open(tmp_path / "results.md").read()


def test_a_variants_budget_is_read_from_its_name():
    assert method.variant_gib("torch_uvm_4GiB_b8") == 4
    assert method.variant_gib("torch_uvm_in_backward_12GiB") == 12
    assert method.variant_gib("torch_uvm_4GiB_sweep") == 4
    assert method.variant_gib("accelerate_pinned_8GiB") == 8
    assert method.variant_gib("torch_uvm_in_backward") is None
    assert method.variant_gib("resident") is None
    assert method.variant_gib("torch_uvm_4GiBx") is None
    assert method.variant_gib("torch_uvm_0.5GiB") == 0.5


def test_busy_times_counts_each_kind_once_and_splits_the_phases():
    """Two kernels overlapping count once; a copy beside a kernel leaves the
    kernel's time without a copy shorter; the GPU idle between them; each
    phase sees only its own window; rates while busy."""
    ev = [
        {"cat": "kernel", "name": "k1", "ts": 0, "dur": 100},
        {"cat": "kernel", "name": "k2", "ts": 50, "dur": 100},          # overlaps k1: 0-150
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 100, "dur": 100,
         "args": {"bytes": 5_000_000}},                                 # 100-200
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 300, "dur": 50,
         "args": {"bytes": 1_000_000}},                                 # 300-350, idle 200-300
        {"cat": "cpu_op", "name": "torch_uvm::host_step layers.3", "ts": 250, "dur": 200},
        {"cat": "user_annotation", "name": "phase::forward", "ts": 0, "dur": 200},
        {"cat": "user_annotation", "name": "phase::backward", "ts": 200, "dur": 150},
    ]
    b = method.busy_times(ev)
    step, fwd, bwd = b["step"], b["forward"], b["backward"]
    ms = pytest.approx
    assert step["ms"] == ms(0.35) and step["gpu_idle_ms"] == ms(0.1)
    assert (step["kernels_ms"], step["to_gpu_ms"], step["home_ms"]) == (ms(0.15), ms(0.1), ms(0.05))
    assert step["kernels_without_copies_ms"] == ms(0.1)  # 0-100
    assert step["host_step_ms"] == ms(0.1)               # clipped to the span: 250-350
    assert step["to_gpu_gbps_while_busy"] == ms(50.0) and step["home_gbps_while_busy"] == ms(20.0)
    assert (fwd["kernels_ms"], fwd["to_gpu_ms"], fwd["home_ms"]) == (ms(0.15), ms(0.1), 0)
    assert (bwd["kernels_ms"], bwd["home_ms"], bwd["gpu_idle_ms"]) == (0, ms(0.05), ms(0.1))
    assert method.busy_times([]) == {}


def test_busy_times_says_how_much_of_the_gpus_idle_its_feeding_thread_waited():
    """A thread that launches kernels and waits in a synchronize: the part
    of its wait when the GPU had nothing to do is counted, the part beside
    a kernel is not; another thread's waits (the host step's worker, which
    launches no kernel) are not the feeding thread's; a trace without the
    runtime's calls says nothing of waits."""
    ev = [
        {"cat": "kernel", "name": "k1", "ts": 0, "dur": 100},
        {"cat": "kernel", "name": "k2", "ts": 300, "dur": 100},         # GPU idle 100-300
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 5, "pid": 1, "tid": 7},
        {"cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 50, "dur": 150,
         "pid": 1, "tid": 7},                                           # 50-200: 100 of it idle
        {"cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 200, "dur": 100,
         "pid": 1, "tid": 9},                                           # the worker's: not counted
        {"cat": "user_annotation", "name": "phase::backward", "ts": 0, "dur": 400},
    ]
    b = method.busy_times(ev)["backward"]
    ms = pytest.approx
    assert b["gpu_idle_ms"] == ms(0.2)
    assert b["host_waits_ms"] == ms(0.15) and b["gpu_idle_in_host_waits_ms"] == ms(0.1)
    assert "host_waits_ms" not in method.busy_times(
        [e for e in ev if e["cat"] != "cuda_runtime"])["backward"]
    assert "while the thread feeding it waited" in method.describe_profile(
        "x", {"gpu_span_ms": 0.4, "streams": {}, "torch_uvm": {}, "trace": "t",
              "busy": method.busy_times(ev)})


def test_torch_uvm_ranges_count_the_host_apart_from_the_stream():
    """A torch_uvm range given a stream is in a trace twice: on the host
    (its calls) and on the GPU (its copies). The host's time is the host's
    ranges alone; the GPU's copy of a range is its stream's time, and its
    bytes are not counted again."""
    ev = [
        {"cat": "user_annotation", "name": "torch_uvm::bring_ahead layers.1", "ts": 0,
         "dur": 20, "args": {"bytes": 4 << 20}},
        {"cat": "gpu_user_annotation", "name": "torch_uvm::bring_ahead layers.1", "ts": 5,
         "dur": 1700, "args": {"bytes": 4 << 20}},
        {"cat": "user_annotation", "name": "torch_uvm::drop layers.0", "ts": 30, "dur": 10,
         "args": {"bytes": 1 << 20}},
        {"cat": "span", "name": "torch_uvm::host_step layers.3", "ts": 0, "dur": 500},
    ]
    r = method.torch_uvm_ranges(ev)
    assert set(r) == {"torch_uvm::bring_ahead", "torch_uvm::drop"}
    ba = r["torch_uvm::bring_ahead"]
    assert (ba["count"], ba["bytes"]) == (1, 4 << 20)
    assert ba["cpu_ms"] == pytest.approx(0.02) and ba["gpu_ms"] == pytest.approx(1.7)
    assert r["torch_uvm::drop"]["gpu_ms"] == 0
