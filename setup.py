"""Builds the torch_uvm Python package and its native module torch_uvm._C.

The native module compiles the same sources as CMake's libraries: the core
policy (csrc/core), the host and GPU runtimes (csrc/runtime) and the torch glue
(csrc/torch). It links the CUDA runtime but has no .cu files: no kernel of ours
runs on the GPU, so only the CUDA headers and libcudart are needed.
"""
import glob
import os
import shutil

from setuptools import setup


def _cuda_home():
    """torch guesses CUDA_HOME from nvcc's folder, which is wrong where nvcc is a
    wrapper in /usr/local/bin: take the first toolkit that has the headers."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    candidates = ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for home in candidates:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
            os.environ["CUDA_HOME"] = home
            return


_cuda_home()
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def cupti_include():
    """The folder of cupti.h (the driver's unified-memory counters,
    csrc/runtime/um_counters.h): the CUDA toolkit's, or the nvidia-cuda-cupti
    wheel's that torch depends on. None: the counters say they are missing."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
    candidates = [os.path.join(home, "include"), os.path.join(home, "extras", "CUPTI", "include")]
    for spec in ("nvidia.cu13", "nvidia.cuda_cupti", "nvidia.cu12"):
        try:
            module = __import__(spec, fromlist=["__path__"])
            candidates += [os.path.join(p, "include") for p in module.__path__]
        except ImportError:
            pass
    return next((c for c in candidates if os.path.exists(os.path.join(c, "cupti.h"))), None)


CUPTI_INCLUDE = cupti_include()


def sources():
    files = []
    for folder in ("csrc/core", "csrc/runtime", "csrc/torch", "csrc/python"):
        files += sorted(glob.glob(os.path.join(folder, "*.cpp")))
    return files


setup(
    name="torch_uvm",
    version="0.1.0",
    description="Unified (CUDA managed) memory for PyTorch: a caching managed allocator "
    "and zero-copy device moves",
    license="BSD-3-Clause",
    packages=["torch_uvm"],
    ext_modules=[
        CUDAExtension(
            name="torch_uvm._C",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "include")]
            + ([CUPTI_INCLUDE] if CUPTI_INCLUDE else []),
            define_macros=[("TORCH_UVM_WITH_CUPTI", "1")] if CUPTI_INCLUDE else [],
            extra_compile_args={"cxx": ["-O2"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
)
