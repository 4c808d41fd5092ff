#!/usr/bin/env bash
# Everything the GPU machine runs, in one place: build, GPU tests, benchmarks.
#   bash scripts/gpu_session.sh [build] [test] [bench]   (default: all three)
# Logs go to $OUT (the device tool's folder) or results/ under the repo, and a
# short summary is printed last. Never asks for more managed memory than a few
# GiB: the allocator's own cap keeps it below free device memory.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_logs}
mkdir -p "$OUT"
stages=${*:-build test bench}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
summary=()

LOGS=/tmp/torch_uvm_logs
mkdir -p "$LOGS"
run() {  # name, command...   (build logs reach $OUT only when they fail:
  local name=$1; shift        #  the device tool returns at most 8 files)
  local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
  tail -n 25 "$LOGS/$name.log"
  if [ $rc -ne 0 ] || [[ $name != *_build ]]; then cp "$LOGS/$name.log" "$OUT/"; fi
  return $rc
}

for stage in $stages; do
  case $stage in
    build)
      nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
      python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$OUT/gpu.txt"
      cat "$OUT/gpu.txt"
      run cmake_build bash -c "cmake -S . -B build-gpu -G Ninja -DTORCH_UVM_WITH_CUDA=ON && cmake --build build-gpu"
      # The image's default g++ (/opt/gcc) has libstdc++ headers newer than the
      # libstdc++ that Python and torch load: an extension built with it crashes
      # on the first ostream << int. Build with the system compiler.
      if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
      run ext_build python3 setup.py build_ext --inplace
      g++ -O2 -shared -fPIC benchmarks/raw_managed_alloc.cpp -o /tmp/raw_managed_alloc.so \
        -I"$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")/include" \
        -L"$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")/lib64" -lcudart \
        || summary+=("raw_managed_alloc.so: build failed")
      ;;
    test)
      run cuda_tests ./build-gpu/cuda_tests
      run pytest python3 -m pytest -v -rs tests/python
      ;;
    bench)
      run bench env BENCH_BUILD=/tmp python3 benchmarks/run.py --out "$LOGS/bench"
      cp "$LOGS"/bench/results.json "$LOGS"/bench/*.png "$OUT/" 2>/dev/null
      ;;
    demo)
      run demo python3 examples/demo.py
      ;;
  esac
done
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
