#!/usr/bin/env bash
# x2: build; the whole GPU suite with both GPUs visible; beside it on GPU 1: hook cost, larger_than_gpu, 7B generation bounds, differential
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=30 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$SECONDS
python3 setup.py build_ext --inplace > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $((SECONDS-t0)) s"; R=/tmp/r; mkdir -p $R/suite $R/ltg $R/llama $R/diff
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > $R/gpu.txt
nvidia-smi topo -m > $R/topo.txt 2>&1
python3 -c "import torch;print('torch',torch.__version__,'cuda',torch.version.cuda)" >> $R/gpu.txt
(
timeout 500 python3 scripts/gpu_pytest.py --workers 8 --out $R/suite tests/python > $R/suite/gpu_pytest.out 2>&1
echo "suite rc=$? $((SECONDS-t0)) s"; tail -4 $R/suite/gpu_pytest.out
) &
(
export CUDA_VISIBLE_DEVICES=1
PYTHONPATH=$PWD timeout 60 python3 .gl/hookcost.py > $R/hookcost.log 2>&1; echo "hookcost rc=$?"
timeout 150 python3 benchmarks/larger_than_gpu.py --only model --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_offload,torch_uvm_bound_2GiB --out $R/ltg > $R/ltg/ltg.log 2>&1
echo "ltg rc=$? $((SECONDS-t0)) s"
timeout 260 python3 benchmarks/offload_llama.py --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_bound_24GiB_b1,accelerate_24GiB,torch_uvm_bound_5GiB_b1,torch_uvm_bound_5GiB_b8 --out $R/llama > $R/llama/llama.log 2>&1
echo "llama rc=$? $((SECONDS-t0)) s"
timeout 100 python3 scripts/differential.py --seeds 0:100 --out $R/diff > $R/diff/differential.log 2>&1
echo "differential rc=$? $((SECONDS-t0)) s"; tail -3 $R/diff/differential.log
) &
wait
head -60 $R/hookcost.log
grep -v "^    {" $R/ltg/ltg.log | sed -n 3,9p; grep -v "^    {" $R/llama/llama.log | sed -n 3,16p
tar czf $OUT/results.tgz -C $R .
echo "all $((SECONDS-t0)) s"
