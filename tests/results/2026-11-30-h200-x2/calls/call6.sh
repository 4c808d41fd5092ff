#!/usr/bin/env bash
# x2: GPU 0: the 7B full fine-tune recipe beside its anchors (issue 56); GPU 1: offload_generate's meta build, load_llama's bound, the bound and estimate tests (issue 55)
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=30 PYTHONUNBUFFERED=1
t0=$SECONDS
python3 setup.py build_ext --inplace > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $((SECONDS-t0)) s"; R=/tmp/r1; mkdir -p $R/full $R/gen $R/load $R/tests
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > $R/gpu.txt
git rev-parse HEAD > $R/tree.txt; git status --short >> $R/tree.txt
left=$((560-SECONDS+t0))
(CUDA_VISIBLE_DEVICES=0 timeout $left python3 benchmarks/offload_train.py --only llama7b --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_bound_24GiB_in_backward,fsdp2_cpu_offload,torchtune_single_device,deepspeed_zero_offload_bf16 \
  --out $R/full > $R/full/full.log 2>&1; echo "full rc=$? $((SECONDS-t0)) s") &
(export CUDA_VISIBLE_DEVICES=1
 timeout 150 python3 benchmarks/offload_generate.py --rounds 1 --variants pinned_rate,resident,torch_uvm_offload,torch_uvm_bound_2GiB --out $R/gen > $R/gen/gen.log 2>&1; echo "gen rc=$? $((SECONDS-t0)) s"
 timeout 300 python3 benchmarks/load_llama.py --rounds 1 --variants checkpoint,pinned_rate,torch_uvm_checkpoint,torch_uvm_checkpoint_bound --out $R/load > $R/load/load.log 2>&1; echo "load rc=$? $((SECONDS-t0)) s"
 timeout $((540-SECONDS+t0)) python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu_bound.py tests/python/test_estimate.py > $R/tests/bound-estimate.log 2>&1; echo "tests rc=$? $((SECONDS-t0)) s") &
wait
tar czf $OUT/results.tgz -C $R .
grep -v "^    {" $R/full/full.log | grep -v Warning | tail -25; tail -12 $R/gen/gen.log; tail -12 $R/load/load.log; tail -3 $R/tests/bound-estimate.log
