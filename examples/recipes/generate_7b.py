"""A 7B generating on a 24 GB card, from a Hugging Face model folder.

offload(..., gpu_memory="24GiB") chooses the largest budget that keeps the
whole process within 24 GiB, before anything is loaded; the model is made on the meta
device and offload reads its weights from the folder's safetensors into
pinned homes. No GPU: it prints the estimate and says what it would run.

    python examples/recipes/write_llama.py /tmp/llama-7b --shape 7b   # once (random weights)
    python examples/recipes/generate_7b.py /tmp/llama-7b --batch 1
"""
import argparse
import time

import torch

import torch_uvm
from recipe import GPU_MEMORY, PeakGpuMemory, meta_model, plan, report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="config.json and safetensors (write_llama.py writes one)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=512, help="tokens in each prompt")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    gpu = plan(args.folder, "generate", "offload the model", batch=args.batch,
               seq=args.prompt, new_tokens=args.new_tokens)
    if not gpu:
        return
    with PeakGpuMemory() as memory:
        t0 = time.perf_counter()
        model = meta_model(args.folder).eval()
        handle = torch_uvm.offload(model, gpu_memory=GPU_MEMORY, batch=args.batch,
                                   seq=args.prompt + args.new_tokens,
                                   checkpoint=args.folder)
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (args.batch, args.prompt), device="cuda")
        with torch.no_grad():
            model.generate(ids, max_new_tokens=1, do_sample=False)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            t1 = time.perf_counter()
            model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                           do_sample=False)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t1
    print(f"{args.batch * args.new_tokens / seconds:.1f} tokens/s at batch {args.batch} "
          f"({handle.bound.describe()}); {first:.1f} s from start to the first token")
    report("generate", memory.peak)
    handle.undo()


if __name__ == "__main__":
    main()
