"""benchmarks/trees.py reads each benchmark's RESULT the same way, whether
it reports one figure or one per batch (no GPU needed)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import trees  # noqa: E402


def test_a_result_by_batch_is_read_at_its_largest_batch():
    lora = {"tokens_per_step": {"1": 1024, "4": 4096},
            "batches": {"1": {"s_per_step": 1.0, "tokens_per_s": 1024.0},
                        "4": {"s_per_step": 2.0, "tokens_per_s": 2048.0}}}
    assert trees.figure(lora) == (2048.0, True, "tokens/s")
    assert trees.figure({"tokens_per_s": 29.5}) == (29.5, True, "tokens/s")
    assert trees.figure({"tokens_per_step": 2048, "s_per_step": 0.5}) == (4096.0, True, "tokens/s")
    assert trees.figure({"s_per_step": 0.25}) == (4.0, True, "steps/s")


def test_both_trees_are_compared_on_losses_or_tokens_per_batch():
    run = {"batches": {"1": {"losses": [1.5, 1.25]}, "8": {"tokens": [3, 4]}}}
    assert trees.outcome(run) == {"1": [1.5, 1.25], "8": [3, 4]}
    assert trees.outcome({"tokens": [7]}) == [7] and trees.outcome({"losses": [0.5]}) == [0.5]
    assert trees.outcome(run) != trees.outcome({"batches": {"1": {"losses": [1.5, 1.0]},
                                                            "8": {"tokens": [3, 4]}}})


def test_the_process_gpu_memory_is_read_whichever_benchmark_recorded_it():
    assert trees.process_gpu_memory({"process_gpu_memory": {"peak_bytes": 5}}) == {"peak_bytes": 5}
    assert trees.process_gpu_memory({"gpu_peak_run_bytes": 7}) == {"peak_bytes": 7}
    assert trees.process_gpu_memory({"s_per_step": 1.0}) is None


def test_the_warm_up_runs_first_from_this_tree_and_is_not_counted(tmp_path, monkeypatch):
    old = tmp_path / "old"
    (old / "torch_uvm").mkdir(parents=True)
    (old / "torch_uvm" / "_C.so").write_text("")
    (old / "REV").write_text("0" * 40)
    calls = []

    def run_case(tree, case, timeout):
        calls.append((tree, case))
        return {"s_per_step": 0.5 if len(calls) == 1 else 0.25, "losses": [1.0]}
    monkeypatch.setattr(trees, "run_case", run_case)
    monkeypatch.setattr(trees.method, "pinned_rate", lambda: {"h2d_gbps": 55.0})
    monkeypatch.setattr(trees.method, "pyplot", lambda: None)
    trees.main(["--old", str(old), "--rounds", "1", "--cases", "a:s/v,b:s/v",
                "--out", str(tmp_path / "out")])
    assert calls[0] == (trees.ROOT, "a:s/v")          # the warm-up, from this tree
    assert len(calls) == 1 + 2 * 2
    import json
    result = json.load(open(tmp_path / "out" / "trees.json"))
    assert [r["s_per_step"] for r in result["warmup"]] == [0.5]
    assert all(r["s_per_step"] == 0.25 for c in result["runs"].values() for t in c.values() for r in t)
