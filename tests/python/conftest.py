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


def _child_env(env: dict = None) -> dict:
    full_env = dict(os.environ)
    full_env.pop("PYTORCH_ENABLE_UNIFIED_MEMORY", None)
    here = os.path.dirname(os.path.abspath(__file__))   # helpers such as cross_stream
    full_env["PYTHONPATH"] = os.pathsep.join([ROOT, here, full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    return full_env


def run_python(code: str, env: dict = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with the repository on sys.path."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_child_env(env),
                          capture_output=True, text=True, timeout=timeout)


def torchrun(script: str, *args: str, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node nproc script args...`
    (torch.distributed.run, the launcher users already run), with the
    repository on sys.path. Standalone: a free port of its own, not 29500,
    which another run on the machine may hold (a CPU run failed once; its
    output was not kept, so that is a guess at the cause)."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", script, *args],
                          env=_child_env(), capture_output=True, text=True, timeout=timeout)


def run_script(path, code: str, env: dict = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Writes `code` to the file `path` and runs it as a script (`python path`):
    unlike `-c`, a script is what forkserver and spawn re-run in a child."""
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(path)], env=_child_env(env),
                          capture_output=True, text=True, timeout=timeout)


def _cudart():
    """The CUDA runtime library torch loaded."""
    import ctypes
    import glob
    for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so"] + sorted(
            glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib",
                                   "libcudart.so*"))):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise AssertionError("libcudart not found")


def range_attribute(tensor: torch.Tensor, attribute: int) -> int:
    """cudaMemRangeGetAttribute over the tensor's bytes, read straight from the
    CUDA runtime: 1 read-mostly, 2 preferred location, 4 last prefetch
    location (a device, or -1 for the CPU)."""
    import ctypes
    lib = _cudart()
    value = ctypes.c_int(-7)
    nbytes = tensor.numel() * tensor.element_size()
    err = lib.cudaMemRangeGetAttribute(ctypes.byref(value), ctypes.c_size_t(4), ctypes.c_int(attribute),
                                       ctypes.c_void_p(tensor.data_ptr()), ctypes.c_size_t(nbytes))
    assert err == 0, f"cudaMemRangeGetAttribute failed: {err}"
    return value.value


READ_MOSTLY, PREFERRED_LOCATION, LAST_PREFETCH_LOCATION = 1, 2, 4


def _pointer_attributes(tensor: torch.Tensor):
    import ctypes

    class Attributes(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                    ("device_pointer", ctypes.c_void_p), ("host_pointer", ctypes.c_void_p),
                    ("reserved", ctypes.c_byte * 256)]   # newer runtimes' fields, room to spare
    attributes = Attributes()
    err = _cudart().cudaPointerGetAttributes(ctypes.byref(attributes),
                                             ctypes.c_void_p(tensor.data_ptr()))
    assert err == 0, f"cudaPointerGetAttributes failed: {err}"
    return attributes


def memory_type(tensor: torch.Tensor) -> str:
    """The kind of a tensor's memory, asked of the CUDA runtime: "host"
    (pinned), "device" or "managed"."""
    attributes = _pointer_attributes(tensor)
    kind = {1: "host", 2: "device", 3: "managed"}.get(attributes.type)
    assert kind is not None, f"unregistered memory (type {attributes.type})"
    return kind


def memory_device(tensor: torch.Tensor) -> int:
    """The GPU a tensor's device memory belongs to, asked of the CUDA runtime."""
    return _pointer_attributes(tensor).device


def where(tensor: torch.Tensor) -> str:
    """Where a tensor's memory is, asked of the CUDA runtime: "gpu" for
    device memory or managed memory preferring a GPU, "host" for pinned host
    memory (a streamed tensor's home) or managed memory preferring the CPU."""
    kind = memory_type(tensor)
    if kind == "managed":
        return "gpu" if range_attribute(tensor, PREFERRED_LOCATION) >= 0 else "host"
    return {"device": "gpu"}.get(kind, kind)


@pytest.fixture(autouse=True)
def environment_restored():
    """Each test leaves os.environ as it found it. Lightning's DDP sets
    MASTER_ADDR, MASTER_PORT and the ranks' variables and leaves them, and
    accelerate then takes a later example's process (in the same pytest
    worker) for one rank of a launch and waits for a RANK."""
    kept = dict(os.environ)
    yield
    for key in [k for k in os.environ if k not in kept]:    # (only what changed: threads
        del os.environ[key]                                  # left running may read it)
    for key, value in kept.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


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
