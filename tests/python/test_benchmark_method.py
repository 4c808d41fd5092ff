"""The benchmark method (issue 12): paired ratios with their spread, targets
that a spread straddles, and the change between two result files. No GPU."""
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


def test_interleaving_runs_every_variant_once_per_round():
    order = []
    runs = method.interleaved(["a", "b"], 3, lambda v: order.append(v) or {"v": v})
    assert order == ["a", "b"] * 3 and len(runs["a"]) == 3


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
    path = os.path.join(ROOT, "benchmarks", "results", "2026-11-23-h100-larger_than_gpu.json")
    rows = compare.changes(compare.load(path), compare.load(path))
    assert rows and all(change == 0 for _, _, _, change, _ in rows)
