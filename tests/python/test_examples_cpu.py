"""The how-to examples in examples/, without a GPU, as CI runs them: each
example that needs no GPU runs to its end; each one that needs a GPU says
so and exits with status 2 (its imports and its code up to that point ran).
The GPU suite runs the rest in full (test_gpu_howto_examples.py); the
training examples in examples/training/ are test_gpu_examples.py's.

Each example runs in a fresh process, as a user runs it
(`python examples/NAME.py`); they run side by side, since each spends most
of its time importing torch."""
import os
import subprocess
import sys

import pytest

from conftest import HAS_GPU, ROOT, _child_env

FOLDER = os.path.join(ROOT, "examples")
# demo.py is scripts/demo.sh's: without a GPU it builds the C++ suites.
EXAMPLES = sorted(f[:-3] for f in os.listdir(FOLDER)
                  if f.endswith(".py") and not f.startswith("_") and f != "demo.py")
NEED_NO_GPU = ["configuration"]
NEED_A_GPU = [e for e in EXAMPLES if e not in NEED_NO_GPU]
TIMEOUT = 240


@pytest.fixture(scope="module")
def ran():
    """{example: CompletedProcess}, each run in a process of its own, all at once."""
    names = NEED_NO_GPU + ([] if HAS_GPU else NEED_A_GPU)
    processes = {name: subprocess.Popen([sys.executable, os.path.join(FOLDER, name + ".py")],
                                        cwd=ROOT, env=_child_env(), text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for name in names}
    results = {}
    for name, p in processes.items():
        try:
            out, err = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results[name] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    return results


def test_every_example_is_sorted_into_one_list():
    assert set(NEED_NO_GPU) <= set(EXAMPLES), "an example named here is not in examples/"
    assert EXAMPLES, "no examples found"


@pytest.mark.parametrize("name", NEED_NO_GPU)
def test_an_example_that_needs_no_gpu_runs_to_its_end(ran, name):
    r = ran[name]
    assert r.returncode == 0, f"{name}.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.stdout.strip(), f"{name}.py printed nothing"


@pytest.mark.skipif(HAS_GPU, reason="with a GPU, test_gpu_howto_examples.py runs them in full")
@pytest.mark.parametrize("name", NEED_A_GPU)
def test_an_example_that_needs_a_gpu_says_so_without_one(ran, name):
    r = ran[name]
    assert r.returncode == 2, f"{name}.py: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert "needs a CUDA GPU" in r.stderr, r.stderr[-3000:]


@pytest.mark.skipif(HAS_GPU, reason="with a GPU, test_gpu_howto_examples.py runs the demo")
def test_the_demo_without_a_gpu_says_what_a_7b_takes_then_runs_the_policy_tests():
    """README's first command on a machine without a GPU: the estimate of a
    7B on a 24 GiB card (the full fine-tune streams; the others fit whole),
    then the C++ tests of the policy over host memory."""
    r = subprocess.run([sys.executable, os.path.join(FOLDER, "demo.py")], cwd=ROOT,
                       env=_child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"demo.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert "full fine-tune, fp32 + AdamW   streamed" in r.stdout, r.stdout
    assert "No CUDA GPU here" in r.stdout and "PASSED" in r.stdout, r.stdout
