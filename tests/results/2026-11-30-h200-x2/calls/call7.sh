#!/usr/bin/env bash
# x2, GPU 0 alone: the 7B full fine-tune recipe beside FSDP2's and DeepSpeed's offload, with the host step (issue 56); GPU 1 idle (clean timings)
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=30 PYTHONUNBUFFERED=1
t0=$SECONDS
python3 setup.py build_ext --inplace > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $((SECONDS-t0)) s"; R=/tmp/r2; mkdir -p $R/full
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > $R/gpu.txt
git rev-parse HEAD > $R/tree.txt; git status --short >> $R/tree.txt
CUDA_VISIBLE_DEVICES=0 timeout $((575-SECONDS+t0)) python3 benchmarks/offload_train.py --only llama7b --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_bound_24GiB_in_backward,fsdp2_cpu_offload,deepspeed_zero_offload_bf16,torch_uvm_bound_24GiB_in_backward_host1_nonblocking \
  --out $R/full > $R/full/full.log 2>&1; echo "full rc=$? $((SECONDS-t0)) s"
tar czf $OUT/results.tgz -C $R .
grep -v "^    {" $R/full/full.log | grep -v Warning | tail -22 | cut -c1-600
grep -a "FAILED\|Error" $R/full/full.log | head -5
