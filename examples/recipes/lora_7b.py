"""LoRA fine-tuning of a 7B on a 24 GB card, from a Hugging Face model folder.

offload(..., gpu_memory="24GiB") chooses the largest budget that keeps the
whole process within 24 GiB, before anything is loaded. The base is made on the meta
device, PEFT adds rank-16 adapters to every projection, and offload reads
the base's weights from the folder by their base names. No GPU: it prints
the estimate and says what it would run.

    python examples/recipes/write_llama.py /tmp/llama-7b --shape 7b   # once (random weights)
    python examples/recipes/lora_7b.py /tmp/llama-7b --batch 4
"""
import argparse
import time

import torch
from peft import LoraConfig, get_peft_model

import torch_uvm
from recipe import GPU_MEMORY, PeakGpuMemory, meta_model, plan, print_steps, report, train

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_model(folder: str):
    """The PEFT model over a base on the meta device; its adapters (PEFT makes
    them on the base's device, meta too) given memory and their first values."""
    base = meta_model(folder)
    base.config.use_cache = False
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=PROJECTIONS,
                                            task_type="CAUSAL_LM"))
    for layer in model.modules():
        if hasattr(layer, "reset_lora_parameters"):
            for name in layer.lora_A:
                layer.lora_A[name].to_empty(device="cpu")
                layer.lora_B[name].to_empty(device="cpu")
                layer.reset_lora_parameters(name, True)
    return model.train()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="config.json and safetensors (write_llama.py writes one)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    gpu = plan(args.folder, "lora", "train the adapters", batch=args.batch, seq=args.seq)
    if not gpu:
        return
    with PeakGpuMemory() as memory:
        t0 = time.perf_counter()
        model = lora_model(args.folder)
        handle = torch_uvm.offload(model, gpu_memory=GPU_MEMORY, batch=args.batch, seq=args.seq,
                                   checkpoint=args.folder)
        optimizer = handle.stream_optimizer(torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True))
        times = train(model, optimizer, args.batch, args.seq, args.steps, t0)
    print_steps(times, args.batch, args.seq, handle.bound)
    report("LoRA", memory.peak)
    handle.undo()


if __name__ == "__main__":
    main()
