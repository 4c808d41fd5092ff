#!/usr/bin/env bash
# Everything the GPU machine runs, in one place: build, GPU tests, benchmarks.
#   bash scripts/gpu_session.sh [build] [test] [pytest] [bench] [offload] [demo] [stress] [sanitize] [soak] [smoke]
#                               [differential] [trees] [fsdp]
#   (default: build test bench)
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
# The image's default g++ (/opt/gcc) has libstdc++ headers newer than the
# libstdc++ that Python and torch load: anything linking torch built with it
# crashes on the first ostream << int. Build with the system compiler.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi

LOGS=/tmp/torch_uvm_logs
mkdir -p "$LOGS"
run() {  # name, command...   (build logs reach $OUT only when they fail:
  local name=$1; shift        #  the device tool returns at most 8 files;
  local t0=$SECONDS           #  the others are written there as they run,
  local log="$LOGS/$name.log" #  so a call cut by its time limit keeps them)
  [[ $name != *_build ]] && log="$OUT/$name.log"
  "$@" > "$log" 2>&1
  local rc=$?
  summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
  tail -n 25 "$log"
  if [ $rc -ne 0 ] && [[ $name == *_build ]]; then cp "$log" "$OUT/"; fi
  return $rc
}

run_pytest() {  # PYTEST_ARGS picks tests (default: all), PYTEST_K filters them; the tests that
               # need the GPU alone first, then the rest PYTEST_WORKERS at a time (gpu_pytest.py):
               # $OUT/pytest-alone.log and $OUT/pytest-shared.log
  run pytest env TORCH_UVM_CPP_PREFIX="$PWD/build-prefix" timeout ${PYTEST_LIMIT:-480} \
      python3 scripts/gpu_pytest.py --workers ${PYTEST_WORKERS:-4} --out "$OUT" \
      ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-tests/python}
}

install_wheels() {  # anchors carried as wheels (RMM, torchao, bitsandbytes): see docs/development.md
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  fi
}

for stage in $stages; do
  case $stage in
    build)
      nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
      python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$OUT/gpu.txt"
      cat "$OUT/gpu.txt"
      run cmake_build bash -c "cmake -S . -B build-gpu -G Ninja -DTORCH_UVM_WITH_CUDA=ON && cmake --build build-gpu"
      run ext_build python3 setup.py build_ext --inplace
      # libtorch_uvm and its CMake package, then programs built against it.
      run lib_build bash -c "cmake -S . -B build-torch -G Ninja -DTORCH_UVM_WITH_TORCH=ON \
          -DTORCH_UVM_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=$PWD/build-prefix \
          && cmake --build build-torch && cmake --install build-torch"
      run bench_cpp_build bash -c "cmake -S benchmarks/cpp -B build-bench -G Ninja \
          -DCMAKE_PREFIX_PATH=$PWD/build-prefix && cmake --build build-bench"
      g++ -O2 -shared -fPIC benchmarks/raw_managed_alloc.cpp -o /tmp/raw_managed_alloc.so \
        -I"$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")/include" \
        -L"$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")/lib64" -lcudart \
        || summary+=("raw_managed_alloc.so: build failed")
      ;;
    smoke)  # the extension alone, then the tests named by PYTEST_ARGS
      run ext_build python3 setup.py build_ext --inplace
      run pytest timeout ${PYTEST_LIMIT:-400} python3 -m pytest -v -rsP --timeout 300 ${PYTEST_K:+-k "$PYTEST_K"} \
          ${PYTEST_ARGS:-tests/python}
      ;;
    test)
      run cuda_tests timeout 180 ./build-gpu/cuda_tests
      # pytest-timeout (in the GPU image) names a test that hangs, with its stack.
      run_pytest
      ;;
    pytest)  # the test stage's pytest alone
      run_pytest
      ;;
    stress)
      # 10^7 operations on cudaMallocManaged, invariants checked every step.
      run stress env TORCH_UVM_STRESS_OPS=${STRESS_OPS:-10000000} \
          ./build-gpu/cuda_tests --gtest_filter='*Stress*cuda'
      ;;
    sanitize)
      # compute-sanitizer over the CUDA suites (the stress test at 10^5 ops)
      # and the GPU moves and streams tests.
      export TORCH_UVM_STRESS_OPS=100000
      for tool in memcheck racecheck; do
        run "sanitize_$tool" timeout 200 compute-sanitizer --tool $tool --error-exitcode 3 \
            ./build-gpu/cuda_tests --gtest_brief=1
        run "sanitize_${tool}_pytest" timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 \
            --target-processes all python3 -m pytest -q -x tests/python/test_gpu_moves.py
      done
      ;;
    bench)
      install_wheels
      run bench env BENCH_BUILD=/tmp BENCH_CPP="$PWD/build-bench" \
          python3 benchmarks/run.py --out "$LOGS/bench" ${BENCH_ONLY:+--only $BENCH_ONLY}
      cp "$LOGS"/bench/results.json "$LOGS"/bench/*.png "$OUT/" 2>/dev/null
      ;;
    offload)  # issue 20: larger than the GPU, side by side with the anchors. More
              # files than the device tool returns: packed into one archive.
      install_wheels
      rounds=${BENCH_ROUNDS:-2}
      dir="$LOGS/offload"
      mkdir -p "$dir"
      gpt2=${GPT2_VARIANTS:-pinned_rate,resident,torch_uvm_in_backward,fsdp2_cpu_offload}
      for b in "train_mlp offload_train --only mlp" \
               "larger larger_than_gpu --only model,model512 --variants ${LARGER_VARIANTS:-pinned_rate,resident,torch_uvm_offload,pinned_stream,pinned_stream_same_share,accelerate_dispatch}" \
               "generate offload_generate" \
               "train_gpt2 offload_train --only gpt2 --variants $gpt2"; do
        set -- $b
        name=$1 script=$2
        shift 2
        t0=$SECONDS
        timeout ${OFFLOAD_LIMIT:-300} python3 benchmarks/$script.py "$@" --rounds "$rounds" \
            --out "$dir/$name" > "$dir/$name.log" 2>&1
        summary+=("offload $name: rc=$? ($((SECONDS - t0)) s)")
        grep -v "^    {" "$dir/$name.log" | tail -n 30
        tar czf "$OUT/offload_results.tgz" -C "$LOGS" offload   # after each: a cut run keeps it
      done
      ;;
    fsdp)  # issue 57: FSDP2's offload across FSDP_GPUS ranks (benchmarks/fsdp_offload.py),
           # FSDP_ROUNDS a call, added to the rounds of earlier calls on this warm machine
           # (kept in $LOGS/fsdp); FSDP_VARIANTS, FSDP_SHAPE, FSDP_STEPS, FSDP_PROFILE=1 (one profiled step
           # more a launch: fsdp_offload.py --profile); DeepSpeed from .whl
      install_wheels
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      run fsdp timeout ${FSDP_LIMIT:-540} python3 benchmarks/fsdp_offload.py \
          --gpus ${FSDP_GPUS:-2} --shape ${FSDP_SHAPE:-3b} --rounds ${FSDP_ROUNDS:-1} \
          --timeout ${FSDP_TIMEOUT:-200} --append --out "$LOGS/fsdp" \
          ${FSDP_VARIANTS:+--variants $FSDP_VARIANTS} $([ "${FSDP_PROFILE:-0}" = 1 ] && echo --profile)
      tar czf "$OUT/fsdp_results.tgz" -C "$LOGS" fsdp
      ;;
    demo)
      run demo python3 examples/demo.py
      ;;
    differential)  # the random differential test, SEEDS (default 0:300) drawn programs
      run differential timeout ${DIFF_LIMIT:-150} python3 scripts/differential.py \
          --seeds ${SEEDS:-0:300} --out "$OUT/diff"
      ;;
    trees)  # the tree in build-trees/old (made here by trees.py --make-old REV and
            # carried: the device copy's git may lag; else OLD_REV made there) against
            # this one, interleaved: TREES_CASES, TREES_ROUNDS (benchmarks/trees.py)
      if [ ! -d build-trees/old ] && [ -z "${OLD_REV:-}" ]; then
        summary+=("trees: skipped (carry build-trees/old, made by trees.py --make-old REV, or set OLD_REV)")
        continue
      fi
      [ -d build-trees/old ] || run make_old python3 benchmarks/trees.py --make-old "$OLD_REV" \
          build-trees/old
      run old_build bash -c "cd build-trees/old && python3 setup.py build_ext --inplace"
      run trees timeout ${TREES_LIMIT:-480} python3 benchmarks/trees.py --old build-trees/old \
          --rounds ${TREES_ROUNDS:-3} --out "$OUT" ${TREES_CASES:+--cases $TREES_CASES}
      ;;
    soak)  # issue 11's soak; 10 minutes is longer than one device call, so
           # start it with setsid and collect $OUT/soak.* in a later call
      run soak python3 tests/soak/soak.py --minutes ${SOAK_MINUTES:-10} --out "$OUT/soak.json"
      ;;
  esac
done
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
