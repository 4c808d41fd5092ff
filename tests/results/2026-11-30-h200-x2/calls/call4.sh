#!/usr/bin/env bash
# x2: build; GPU 0: the 7B LoRA at 24 GiB against all resident after the fix; GPU 1: the bound's tests
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=30 PYTHONUNBUFFERED=1
t0=$SECONDS
python3 setup.py build_ext --inplace > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $((SECONDS-t0)) s"; R=/tmp/r4; mkdir -p $R/lora
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > $R/gpu.txt
(
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/offload_lora.py --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_bound_24GiB --out $R/lora > $R/lora/lora.log 2>&1
echo "lora rc=$? $((SECONDS-t0)) s"
) &
(
CUDA_VISIBLE_DEVICES=1 timeout 280 python3 -m pytest -v -rsP -p no:cacheprovider tests/python/test_gpu_bound.py tests/python/test_gpu_memory.py tests/python/test_estimate.py > $R/pytest-bound.log 2>&1
echo "bound tests rc=$? $((SECONDS-t0)) s"; tail -3 $R/pytest-bound.log
) &
wait
grep -v "^    {" $R/lora/lora.log | sed -n 3,12p
tar czf $OUT/results.tgz -C $R .
