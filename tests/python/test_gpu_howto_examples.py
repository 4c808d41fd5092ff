"""The how-to examples in examples/ that need a GPU, each run in full in a
fresh process as a user runs it (`python examples/NAME.py`): each checks
what its page says with asserts, so exit status 0 means every check held.
Skipped without a GPU, where test_examples_cpu.py checks that each says it
needs one. The training examples are test_gpu_examples.py's."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, _child_env, gpu
from test_examples_cpu import NEED_A_GPU

pytestmark = gpu
FOLDER = os.path.join(ROOT, "examples")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NEED_A_GPU)
def test_the_example_runs_and_its_checks_hold(name):
    r = subprocess.run([sys.executable, os.path.join(FOLDER, name + ".py")], cwd=ROOT,
                       env=_child_env(), capture_output=True, text=True, timeout=580)
    assert r.returncode == 0, f"{name}.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.stdout.strip(), f"{name}.py printed nothing"


@pytest.mark.timeout(600)
def test_the_demo_runs_a_model_larger_than_its_budget_bit_for_bit():
    """scripts/demo.sh's demo, as README's first command runs it: the
    estimate, the offloaded model matching all on the GPU (its own assert),
    and UVM on in a process of its own."""
    r = subprocess.run([sys.executable, os.path.join(FOLDER, "demo.py")], cwd=ROOT,
                       env=_child_env(), capture_output=True, text=True, timeout=580)
    assert r.returncode == 0, f"demo.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert "bit-identical to all on the GPU: True" in r.stdout
    assert "kept its memory: True" in r.stdout
