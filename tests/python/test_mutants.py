"""scripts/mutants.py breaks the code each GPU test guards: every mutant's
text must still be in its file, once, or the mutant cannot be made (a
stale one was found this way). The runner's parts are checked here without
a GPU or a build: a run on a small tree of its own, the GPU's gate, which
tests get the GPU alone, and what a core mutant's copy rebuilds."""
import argparse
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_alone  # noqa: E402
import mutants  # noqa: E402


@pytest.mark.parametrize("name,path,text", [(m[0], m[1], m[2]) for m in mutants.MUTANTS])
def test_every_mutant_finds_its_text_once(name, path, text):
    with open(os.path.join(ROOT, path)) as f:
        assert f.read().count(text) == 1, f"mutant '{name}': its text is not in {path} once"


def test_list_says_how_each_mutant_runs_and_checks_its_text(capsys):
    assert mutants.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(m[0] in out for m in mutants.MUTANTS)
    assert "every text is in its file once" in out


def test_a_mutant_with_googletests_and_pytest_tests_runs_each_in_its_own_build():
    """Its pytest tests against the extension, its GoogleTests against
    core_tests: pytest handed "core:..." stops with a usage error (rc 4)."""
    mixed = [e for e in mutants.MUTANTS
             if {t.startswith("core:") for t in e[4]} == {True, False}]
    assert mixed
    for e in mutants.MUTANTS:
        runs = mutants.mutants_of(e)
        assert sorted(t for m in runs for t in m.tests) == sorted(e[4])
        for m in runs:
            assert {t.startswith("core:") for t in m.tests} == {m.kind == "core"}
        assert len({m.name for m in runs}) == len(runs)
    e = mixed[0]
    assert [m.kind for m in mutants.mutants_of(e, core=True)] == ["core"]
    assert mutants.mutants_of(e, core=False)[0].kind != "core"


def test_the_gpu_and_the_cpu_mutants_split_the_non_core_ones(capsys):
    every = [m for e in mutants.MUTANTS for m in mutants.mutants_of(e)]
    gpu = [m.name for m in every if m.kind != "core" and m.needs_gpu]
    cpu = [m.name for m in every if m.kind != "core" and not m.needs_gpu]
    assert gpu and cpu and not set(gpu) & set(cpu)
    assert len(gpu) + len(cpu) == sum(m.kind != "core" for m in every)
    assert all(m.needs_gpu for m in every if m.path.startswith("csrc/torch"))
    killed_by_a_gpu_test = [m[0] for m in mutants.MUTANTS if m[1].endswith(".py")
                            and any(t.startswith("tests/python/test_gpu") for t in m[4])]
    assert killed_by_a_gpu_test and set(killed_by_a_gpu_test) <= set(gpu)
    assert mutants.main(["--list", "--gpu-only"]) == 0
    listed = capsys.readouterr().out
    assert all(n in listed for n in gpu) and not any(n in listed for n in cpu)
    assert mutants.main(["--list", "--cpu-only"]) == 0
    listed = capsys.readouterr().out
    assert all(n in listed for n in cpu) and not any(n in listed for n in gpu)


def _args(**kw):
    base = dict(jobs=2, test_slots=0, timeout=60, out=None, cmake_build=None, no_build=True,
                tmp=None, keep=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_run_patches_copies_only_and_says_what_each_mutant_did(tmp_path, capsys):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pkg.py").write_text("def f():\n    return 1\n")
    (tree / "test_pkg.py").write_text(
        "import pytest\nfrom pkg import f\n\n\ndef test_f():\n    assert f() == 1\n\n\n"
        "def test_skipped():\n    pytest.skip('no GPU')\n")
    (tree / ".gitignore").write_text("build*/\n")
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    entries = [("f returns 2", "pkg.py", "return 1", "return 2", ["test_pkg.py::test_f"]),
               ("f is the same", "pkg.py", "def f():", "def f():  # same", ["test_pkg.py::test_f"]),
               ("only skipped", "pkg.py", "return 1", "return 3", ["test_pkg.py::test_skipped"]),
               ("gone", "pkg.py", "return 9", "return 2", ["test_pkg.py::test_f"])]
    out = tmp_path / "logs"
    runner = mutants.Runner(str(tree), _args(out=str(out)))
    rc = runner.run([mutants.Mutant(e) for e in entries])
    assert rc == 1                                       # not all were killed
    table = capsys.readouterr().out
    assert "| f returns 2 | test_f | killed |" in table
    assert "| f is the same | test_f | SURVIVED |" in table
    assert "| only skipped | test_skipped | all skipped |" in table
    assert "| gone | test_f | text not found once: fix the mutant |" in table
    assert "1 of 4 killed" in table
    assert (tree / "pkg.py").read_text() == "def f():\n    return 1\n"
    assert sorted(os.listdir(out)) == ["mutant_f_is_the_same.log", "mutant_f_returns_2.log",
                                       "mutant_gone.log", "mutant_only_skipped.log", "summary.md"]
    assert "return 2" in (out / "mutant_f_returns_2.log").read_text()
    assert not os.path.exists(runner.tmp)               # the copies are gone


def test_a_fresh_tree_finds_the_objects_its_first_build_made(tmp_path, monkeypatch):
    """On a fresh machine build/temp.* is made by the run's own build: the
    C++ mutants' plan must find it then (it stopped with "no build/temp.*")."""
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    runner = mutants.Runner(str(tree), _args(no_build=False))
    assert runner.temp_dir is None

    def build(chosen):
        made = tree / "build" / f"temp.linux-{sys.implementation.cache_tag}"
        made.mkdir(parents=True)
        (made / "build.ninja").write_text("")
    planned = []

    class Planned(Exception):
        pass

    def plan(chosen):
        planned.append(runner.temp_dir)
        raise Planned()
    monkeypatch.setattr(runner, "build_tree", build)
    monkeypatch.setattr(runner, "plan", plan)
    with pytest.raises(Planned):
        runner.run([mutants.Mutant(("m", "a.cpp", "x", "y", ["test_a.py::test_a"]))])
    assert planned and planned[0] and planned[0].endswith(sys.implementation.cache_tag)


def test_a_copy_without_git_leaves_what_gitignore_ignores(tmp_path):
    (tmp_path / ".gitignore").write_text("build*/\n*.so\n/.whl/\n")
    for name in ["a.py", "pkg/_C.so", "pkg/b.py", "build/temp/x.o", "build-gpu/y",
                 ".whl/w.whl", "sub/.whl/kept", ".git/HEAD"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert mutants.walk_files(str(tmp_path)) == [".gitignore", "a.py", "pkg/b.py", "sub/.whl/kept"]


def test_a_test_that_measures_the_devices_memory_gets_the_gpu_alone(tmp_path):
    (tmp_path / "helpers.py").write_text(
        "import torch\n\ndef free():\n    return torch.cuda.mem_get_info()[0]\n\n"
        "def peak(model):\n    return free()\n")
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef watch():\n    from helpers import peak\n"
        "    return peak\n")
    (tmp_path / "test_x.py").write_text(
        "from helpers import peak\n\ndef test_direct():\n    assert peak(None)\n\n"
        "def test_fixture(watch):\n    pass\n\ndef test_plain():\n    assert 1\n\n"
        "def test_param(x=1):\n    assert free\n\n"
        "def test_capped(uvm):\n    uvm.offload(None, budget=uvm.get_memory_cap() // 2)\n")
    cache = {}
    measures = {n: gpu_alone.measures_device_memory(f"test_x.py::{n}", str(tmp_path), cache)
                for n in ["test_direct", "test_fixture", "test_plain", "test_param[2]",
                          "test_capped"]}
    assert measures == {"test_direct": True, "test_fixture": True, "test_plain": False,
                        "test_param[2]": True, "test_capped": True}


def _until(ready):
    deadline = time.time() + 5
    while not ready():
        assert time.time() < deadline
        time.sleep(0.01)


def test_an_exclusive_run_waits_for_shared_ones_and_no_shared_one_starts_meanwhile():
    gate = mutants.GpuGate(4, threading.Event())
    events, release, threads = [], {}, []

    def start(name, exclusive):
        release[name] = threading.Event()

        def run():
            with gate.hold(exclusive):
                events.append(("start", name))
                release[name].wait(5)
                events.append(("end", name))
        threads.append(threading.Thread(target=run))
        threads[-1].start()

    start("shared", False)
    _until(lambda: events == [("start", "shared")])
    start("alone", True)
    _until(lambda: gate.waiting == 1)
    start("later", False)
    time.sleep(0.2)
    assert events == [("start", "shared")]     # the exclusive run waits, and so does a later one
    release["shared"].set()
    _until(lambda: ("start", "alone") in events)
    time.sleep(0.2)
    assert events[-1] == ("start", "alone")    # alone
    release["alone"].set()
    release["later"].set()
    for t in threads:
        t.join(5)
    assert events == [("start", "shared"), ("end", "shared"), ("start", "alone"),
                      ("end", "alone"), ("start", "later"), ("end", "later")]


def test_a_core_mutant_replays_the_compile_the_archive_and_the_link():
    commands = [
        "/usr/bin/c++ -I/r/csrc -MD -MT o/a.cpp.o -MF o/a.cpp.o.d -o o/a.cpp.o -c /r/csrc/a.cpp",
        "/usr/bin/c++ -I/r/csrc -o o/b.cpp.o -c /r/csrc/b.cpp",
        "/usr/bin/c++ -I/r/tests -o t/t.cpp.o -c /r/tests/t.cpp",
        ": && /usr/bin/cmake -E rm -f libcore.a && /usr/bin/ar qc libcore.a  o/a.cpp.o o/b.cpp.o "
        "&& /usr/bin/ranlib libcore.a && :",
        ": && /usr/bin/cmake -E rm -f lib/libgtest.a && /usr/bin/ar qc lib/libgtest.a g/gtest.o && :",
        ": && /usr/bin/c++ -O2 t/t.cpp.o -o core_tests  libcore.a  lib/libgtest.a && :",
    ]
    chosen, made = mutants.commands_after(commands, {"o/b.cpp.o"})
    assert chosen == [commands[1], commands[3], commands[5]]
    assert made == {"o/b.cpp.o", "libcore.a", "core_tests"}


def test_a_copy_compiles_its_own_file_with_the_trees_flags(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cpp").write_text("")
    cmd = "/usr/bin/c++ -I/r/csrc -I/r/build/gen -o o/a.o -c /r/csrc/a.cpp"
    copied = mutants.in_copy(cmd, "/r", str(tmp_path))
    assert copied == (f"/usr/bin/c++ -I{tmp_path}/csrc -I/r/build/gen -o o/a.o "
                      f"-c {tmp_path}/csrc/a.cpp")
    assert mutants.in_copy("-I/r2/csrc", "/r", str(tmp_path)) == "-I/r2/csrc"


@pytest.mark.parametrize("kind,rc,output,outcome", [
    ("python", 1, "1 failed in 2.0s", "killed"),
    ("python", 0, "1 passed in 2.0s", "SURVIVED"),
    ("python", 0, "1 passed, 1 skipped in 2.0s", "SURVIVED"),
    ("python", 0, "2 skipped in 0.1s", "all skipped"),
    ("python", 5, "no tests ran in 0.1s", "no tests ran"),
    ("python", 4, "ERROR: not found", "tests rc=4"),
    ("core", 1, "[  FAILED  ] 1 test", "killed"),
    ("core", 0, "[==========] Running 0 tests from 0 test suites.", "no tests ran"),
])
def test_each_outcome_is_named(kind, rc, output, outcome):
    assert mutants.outcome_of(kind, rc, output, False) == outcome
    assert mutants.outcome_of(kind, rc, output, True) == "killed (timed out)"
