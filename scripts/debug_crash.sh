#!/usr/bin/env bash
# Native backtrace of one pytest case under cuda-gdb (the GPU image has no gdb).
cd "$(dirname "$0")/.."
cuda-gdb -batch -ex run -ex bt -ex quit --args python3 -m pytest -x -q -p no:cacheprovider tests/python/test_gpu_moves.py -k "$1" 2>&1 | grep -v "^\[New Thread\|^\[Thread\|^\[Detaching" | grep -E "^#[0-9]+ " | head -22
