"""scripts/gpu_pytest.py, the GPU suite in one device call, checked without
a GPU: which tests it gives the GPU alone, in which order it runs the two
groups, and what it reports of each."""
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_pytest  # noqa: E402


def test_the_tests_that_read_the_device_go_alone_and_keep_their_order(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import torch\n\ndef test_a():\n    pass\n\n"
        "def test_b():\n    assert torch.cuda.mem_get_info()\n\n"
        "def test_c(uvm):\n    uvm.set_memory_cap(1)\n\ndef test_d():\n    pass\n")
    ids = [f"test_x.py::test_{n}" for n in "abcd"] + ["test_x.py::test_b[2]"]
    alone, shared = gpu_pytest.split(ids, root=str(tmp_path))
    assert alone == ["test_x.py::test_b", "test_x.py::test_c", "test_x.py::test_b[2]"]
    assert shared == ["test_x.py::test_a", "test_x.py::test_d"]


def test_each_run_is_reported_by_pytests_closing_line():
    log = ("tests/x.py::test_a PASSED\n\n=== short test summary info ===\n"
           "===== 1 failed, 3 passed, 2 skipped in 12.34s =====\n\n"
           "Exception ignored in atexit callback: <function _exit at 0x7f>\n")   # after it
    assert gpu_pytest.closing_line(log) == "===== 1 failed, 3 passed, 2 skipped in 12.34s ====="
    assert gpu_pytest.closing_line("Killed\n") == "Killed"
    assert gpu_pytest.closing_line("") == "(no output)"


def test_the_alone_run_comes_first_and_a_failure_in_either_fails_the_whole(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_pytest, "collect", lambda paths, keyword: ["t.py::a", "t.py::b"])
    monkeypatch.setattr(gpu_pytest, "split", lambda ids: (["t.py::a"], ["t.py::b"]))
    calls = []

    def run(name, ids, out, timeout, workers):
        calls.append((name, ids, workers))
        return 1 if name == "pytest-alone" else 0
    monkeypatch.setattr(gpu_pytest, "run", run)
    monkeypatch.setattr(gpu_pytest, "has_xdist", lambda: True)
    assert gpu_pytest.main(["--out", str(tmp_path), "--workers", "3"]) == 1
    assert calls == [("pytest-alone", ["t.py::a"], 1), ("pytest-shared", ["t.py::b"], 3)]
