#!/usr/bin/env bash
# x2: build; GPU 0: larger_than_gpu + offload_generate (55); GPU 1: hook cost, step-in-backward tests, 7B bounds
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=30 PYTHONUNBUFFERED=1
t0=$SECONDS
python3 setup.py build_ext --inplace > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $((SECONDS-t0)) s"; nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > $OUT/gpu.txt
(
export CUDA_VISIBLE_DEVICES=0
timeout 150 python3 benchmarks/larger_than_gpu.py --only model --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_offload,torch_uvm_bound_2GiB --out $OUT/ltg > $OUT/ltg.log 2>&1
echo "ltg rc=$? $((SECONDS-t0)) s"
timeout 150 python3 benchmarks/offload_generate.py --rounds 1 \
  --variants pinned_rate,torch_uvm_offload,torch_uvm_bound_2GiB --out $OUT/gen > $OUT/gen.log 2>&1
echo "gen rc=$? $((SECONDS-t0)) s"
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/python/test_gpu_steps_behind.py tests/python/test_gpu_training_loops.py tests/python/test_lifecycle.py -k "backward or behind or drawn" > $OUT/pytest-steps.log 2>&1
echo "steps tests rc=$? $((SECONDS-t0)) s"; tail -2 $OUT/pytest-steps.log
) &
(
export CUDA_VISIBLE_DEVICES=1
timeout 60 python3 .gl/hookcost.py > $OUT/hookcost.log 2>&1; echo "hookcost rc=$?"
timeout 330 python3 benchmarks/offload_llama.py --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_bound_24GiB_b1,accelerate_24GiB,torch_uvm_bound_5GiB_b1,torch_uvm_bound_5GiB_b8 --out $OUT/llama > $OUT/llama.log 2>&1
echo "llama rc=$? $((SECONDS-t0)) s"
) &
wait
cat $OUT/hookcost.log | head -80
for f in ltg gen llama; do echo "== $f"; grep -v "^    {" $OUT/$f.log | tail -9; done
echo "all $((SECONDS-t0)) s"
