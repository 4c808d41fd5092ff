#!/usr/bin/env bash
# x2, GPU 0: the 7B LoRA recipe's anchors at 24 GiB, one run (issue 56)
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=30 PYTHONUNBUFFERED=1
t0=$SECONDS
[ -f torch_uvm/_C*.so ] && python3 -c "import torch_uvm" 2>/dev/null || { python3 setup.py build_ext --inplace > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }; }
echo "build $((SECONDS-t0)) s"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
R=/tmp/r3; mkdir -p $R/lora
export CUDA_VISIBLE_DEVICES=0
timeout 520 python3 benchmarks/offload_lora.py --rounds 1 \
  --variants pinned_rate,resident,torch_uvm_bound_24GiB,torch_uvm_bound_6GiB,fsdp2_cpu_offload,qlora_nf4,deepspeed_zero3_offload --out $R/lora > $R/lora/lora.log 2>&1
echo "lora rc=$? $((SECONDS-t0)) s"
grep -v "^    {" $R/lora/lora.log | tail -40
tar czf $OUT/results.tgz -C $R .
