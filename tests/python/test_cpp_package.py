"""The C++ side: libtorch_uvm installed as the CMake package TorchUVM, and the
example program in examples/cpp built against it and run.

Builds with CMake into a temporary folder (a few minutes), or uses an
installed prefix given in TORCH_UVM_CPP_PREFIX (scripts/gpu_session.sh builds
one). Without a GPU the example must say so clearly and exit with 2; with one
it must pass every check. PYTORCH_ENABLE_UNIFIED_MEMORY is honoured when the
library loads."""
import os
import shutil
import subprocess

import pytest

from conftest import HAS_GPU, ROOT

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def _run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """Path of the example program, built against the installed package."""
    tmp = tmp_path_factory.mktemp("cpp")
    prefix = os.environ.get("TORCH_UVM_CPP_PREFIX")
    if not prefix:
        prefix = str(tmp / "prefix")
        build = str(tmp / "build")
        _run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DTORCH_UVM_WITH_TORCH=ON",
              "-DTORCH_UVM_BUILD_TESTS=OFF", f"-DCMAKE_INSTALL_PREFIX={prefix}"])
        _run(["cmake", "--build", build])
        _run(["cmake", "--install", build])
    assert os.path.exists(os.path.join(prefix, "lib", "cmake", "TorchUVM", "TorchUVMConfig.cmake"))
    build = str(tmp / "example")
    _run(["cmake", "-S", os.path.join(ROOT, "examples", "cpp"), "-B", build, "-G", "Ninja",
          f"-DCMAKE_PREFIX_PATH={prefix}"])
    _run(["cmake", "--build", build])
    return os.path.join(build, "uvm_example")


def run_example(path, value=None):
    env = dict(os.environ)
    env.pop("PYTORCH_ENABLE_UNIFIED_MEMORY", None)
    if value is not None:
        env["PYTORCH_ENABLE_UNIFIED_MEMORY"] = value
    return subprocess.run([path], capture_output=True, text=True, env=env, timeout=300)


def test_the_example_builds_against_the_package_and_runs(example):
    r = run_example(example)
    assert "enabled at load: no" in r.stdout
    if HAS_GPU:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "all checks passed" in r.stdout
        assert "ok:   x.to(kCUDA) is zero-copy" in r.stdout
    else:
        assert r.returncode == 2, r.stdout + r.stderr
        assert "no CUDA or ROCm device was found" in r.stdout


def test_the_environment_variable_enables_uvm_when_the_library_loads(example):
    r = run_example(example, "1")
    if HAS_GPU:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "enabled at load: yes" in r.stdout
    else:
        # A static initializer cannot throw: it says why UVM stays off.
        assert "enabled at load: no" in r.stdout
        assert "PYTORCH_ENABLE_UNIFIED_MEMORY=1 is set, but UVM stays off" in r.stderr
        assert "no CUDA or ROCm device" in r.stderr
        assert r.returncode == 2


def test_a_bad_environment_value_is_reported_at_load(example):
    r = run_example(example, "banana")
    assert "enabled at load: no" in r.stdout
    assert "PYTORCH_ENABLE_UNIFIED_MEMORY=banana is set, but UVM stays off" in r.stderr
    assert "expected 1/0, true/false" in r.stderr
    assert r.returncode == (0 if HAS_GPU else 2), r.stdout + r.stderr


def test_zero_leaves_uvm_off_at_load(example):
    r = run_example(example, "0")
    assert "enabled at load: no" in r.stdout
    assert "UVM stays off" not in r.stderr
