#!/usr/bin/env bash
# Installs what torch_uvm needs to build and test, on a fresh Debian machine:
# compilers, CMake, ninja, GoogleTest sources and the HIP headers (apt), torch
# and pytest (pip; this workplace's pip serves torch 2.14.1 from local wheels),
# then builds the Python extension in place. Idempotent.
#   bash scripts/setup.sh         everything the tests need
#   bash scripts/setup.sh demo    what examples/demo.py needs alone: the compiler,
#                                 ninja, torch, numpy, safetensors and the extension
#                                 (a GPU machine without network has them all)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") demo=0 ;;
  demo) demo=1 ;;
  *) echo "setup.sh: no such mode '$1' (none for everything the tests need, or demo)" >&2; exit 2 ;;
esac
need_apt=()
if [ $demo = 1 ]; then      # (a compiler and ninja, from apt or not)
  command -v g++ >/dev/null || need_apt+=(g++)
  command -v ninja >/dev/null || python3 -c "import ninja" 2>/dev/null || need_apt+=(ninja-build)
else
  for pkg in g++ cmake ninja-build googletest libamdhip64-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
  done
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.14.1"
python3 -c "import numpy" 2>/dev/null || python3 -m pip install -q numpy
python3 -c "import safetensors" 2>/dev/null || python3 -m pip install -q safetensors   # checkpoints (and the demo's model folder)
if [ $demo = 0 ]; then
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q pytest
python3 -c "import scipy" 2>/dev/null || python3 -m pip install -q scipy               # the benchmarks' least-step bound (linprog)
# Lightning's strategy is tested with a real Trainer (tests/python/test_lightning_strategy.py);
# where pip cannot get it, those tests skip.
python3 -c "import lightning" 2>/dev/null || python3 -m pip install -q lightning \
  || echo "setup: lightning not installed: its strategy's tests skip"
# Hugging Face models in the tests (the trainers' integrations, PEFT's names in
# a checkpoint, the estimate of a model itself); where pip cannot get them, those skip.
python3 -c "import transformers, peft" 2>/dev/null || python3 -m pip install -q transformers peft \
  || echo "setup: transformers or peft not installed: their tests skip"
fi
# The native module (needs the CUDA headers; no GPU needed to build), with the
# system compiler where there is one: an image's own g++ (the GPU machines'
# /opt/gcc) may have libstdc++ headers newer than the libstdc++ torch loads,
# and a module built with it crashes (scripts/gpu_session.sh does the same).
if [ -x /usr/bin/g++ ] && [ -z "${CXX:-}${CC:-}" ] && [ "$(command -v g++)" != /usr/bin/g++ ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++
  echo "setup: building with the system compiler, /usr/bin/g++ (not $(command -v g++))" >&2
fi
mkdir -p build
if ! python3 setup.py build_ext --inplace > build/ext_build.log 2>&1; then
  tail -n 60 build/ext_build.log >&2
  echo "setup: building the extension failed (full log: build/ext_build.log)" >&2
  exit 1
fi
python3 -c "import torch_uvm" && echo "setup: torch_uvm built"
