"""Shared fixtures. GPU tests run in a session where UVM is enabled before any
CUDA allocation (UVM is process-wide and cannot be turned off); checks that
need UVM off, or a fresh process, run Python in a subprocess."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_GPU = torch.cuda.is_available()
GPU_COUNT = torch.cuda.device_count() if HAS_GPU else 0

gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
multigpu = pytest.mark.skipif(GPU_COUNT < 2, reason="needs two CUDA devices")


def run_python(code: str, env: dict = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with the repository on sys.path."""
    full_env = dict(os.environ)
    full_env.pop("PYTORCH_ENABLE_UNIFIED_MEMORY", None)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def uvm():
    """torch_uvm with UVM on (GPU tests only)."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA device")
    import torch_uvm
    torch_uvm.set_enabled_uvm(True)
    return torch_uvm


def pytest_collection_modifyitems(config, items):
    # Enable UVM before any GPU test can touch CUDA: order GPU modules last is
    # not enough (CPU tests never touch CUDA), so enable at collection time.
    if HAS_GPU:
        import torch_uvm
        torch_uvm.set_enabled_uvm(True)
