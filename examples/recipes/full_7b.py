"""Full fine-tuning of a 7B on a 24 GB card, from a Hugging Face model folder.

Every weight trains, in bf16 with AdamW's states in bf16 (as torchtune's
single-device recipes do): 13.5 GB of weights and 27 GB of states, more
than the card. offload(..., gpu_memory="24GiB") chooses the largest budget
that keeps the whole process within 24 GiB before anything is loaded; the states stay
in pinned host memory and come to the GPU one submodule at a time; each
submodule steps in backward as soon as its gradients are complete, so no
gradient leaves the GPU. No GPU: it prints the estimate and says what it
would run.

    python examples/recipes/write_llama.py /tmp/llama-7b --shape 7b   # once (random weights)
    python examples/recipes/full_7b.py /tmp/llama-7b --batch 1
"""
import argparse
import time

import torch

import torch_uvm
from recipe import GPU_MEMORY, PeakGpuMemory, meta_model, plan, print_steps, report, train


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="config.json and safetensors (write_llama.py writes one)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    gpu = plan(args.folder, "full", "train every weight", batch=args.batch, seq=args.seq,
               autocast=False)
    if not gpu:
        return
    with PeakGpuMemory() as memory:
        t0 = time.perf_counter()
        model = meta_model(args.folder)
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        handle = torch_uvm.offload(model.train(), gpu_memory=GPU_MEMORY, batch=args.batch, seq=args.seq,
                                   checkpoint=args.folder)
        optimizer = handle.stream_optimizer(
            torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True), step_in_backward=True)
        times = train(model, optimizer, args.batch, args.seq, args.steps, t0)
    print_steps(times, args.batch, args.seq, handle.bound)
    report("full fine-tune", memory.peak)
    handle.undo()


if __name__ == "__main__":
    main()
