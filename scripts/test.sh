#!/usr/bin/env bash
# Sets up, then runs every test that runs without a GPU:
#   1. the C++ suites (GoogleTest over the host runtime, incl. a 1M-operation
#      randomized stress test checking every invariant after every step)
#   2. the same suites under AddressSanitizer + UBSan, and under ThreadSanitizer
#   3. the HIP runtime compiled against Debian's HIP headers
#   4. pytest (GPU tests skip without a GPU; run them with scripts/gpu_session.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)

step() { echo; echo "=== $* ==="; }

step "C++ suites (host runtime)"
cmake -S . -B build -G Ninja -DTORCH_UVM_HIP_CHECK=ON >/dev/null
cmake --build build -j "$jobs" >/dev/null
./build/core_tests --gtest_brief=1

step "HIP runtime compiles against the HIP headers"
test -f build/CMakeFiles/torch_uvm_hip_check.dir/csrc/runtime/gpu_runtime.cpp.o
echo "ok: csrc/runtime/gpu_runtime.cpp built with TORCH_UVM_USE_HIP"

step "C++ suites under AddressSanitizer + UBSan"
cmake -S . -B build-asan -G Ninja -DTORCH_UVM_SANITIZE=address,undefined -DTORCH_UVM_WITH_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs" >/dev/null
./build-asan/core_tests --gtest_brief=1

step "C++ suites under ThreadSanitizer"
cmake -S . -B build-tsan -G Ninja -DTORCH_UVM_SANITIZE=thread -DTORCH_UVM_WITH_CUDA=OFF >/dev/null
cmake --build build-tsan -j "$jobs" >/dev/null
# Still 1M operations; the O(blocks) invariant walk every 16th step keeps
# TSan's 10x slowdown within CI's time.
TORCH_UVM_STRESS_CHECK_EVERY=16 ./build-tsan/core_tests --gtest_brief=1

step "pytest"
python3 -m pytest -q -rs tests/python
