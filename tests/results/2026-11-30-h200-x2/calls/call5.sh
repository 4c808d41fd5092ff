#!/usr/bin/env bash
# x2 (last ~4 min): GPU 0: offload_generate with the fp16 build (host peaks); GPU 1: 7B at 24 GiB beside accelerate and all resident
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=30 PYTHONUNBUFFERED=1
t0=$SECONDS
python3 setup.py build_ext --inplace > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $((SECONDS-t0)) s"; R=/tmp/r5; mkdir -p $R/gen $R/llama
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > $R/gpu.txt
left=$((200-SECONDS+t0))
(CUDA_VISIBLE_DEVICES=0 timeout $left python3 benchmarks/offload_generate.py --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_offload,torch_uvm_bound_2GiB --out $R/gen > $R/gen/gen.log 2>&1; echo "gen rc=$? $((SECONDS-t0)) s") &
(CUDA_VISIBLE_DEVICES=1 timeout $left python3 benchmarks/offload_llama.py --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_bound_24GiB_b1,accelerate_24GiB --out $R/llama > $R/llama/llama.log 2>&1; echo "llama rc=$? $((SECONDS-t0)) s") &
wait
tar czf $OUT/results.tgz -C $R .
grep -v "^    {" $R/gen/gen.log | sed -n 3,9p; grep -v "^    {" $R/llama/llama.log | sed -n 3,10p
