"""python -m torch_uvm estimate CONFIG [options]: what an offload of the
model CONFIG (a Hugging Face config.json, or its folder) will take, before
anything is loaded (torch_uvm/estimate.py)."""
import argparse
import sys

from .estimate import TASKS, estimate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_uvm")
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("estimate", help="GPU and host memory, and the link's floor, of an offload")
    e.add_argument("config", help="a config.json, or the folder holding it")
    e.add_argument("--task", choices=TASKS, default="generate")
    e.add_argument("--budget", default=None, help="a size such as 8GiB (default: the least)")
    e.add_argument("--gpu-memory", default=None,
                   help="the most GPU memory the process may take, such as 24GiB: the largest "
                        "budget within it is chosen")
    e.add_argument("--batch", type=int, default=1)
    e.add_argument("--seq", type=int, default=512, help="tokens a sequence (the prompt's)")
    e.add_argument("--new-tokens", type=int, default=32)
    e.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    e.add_argument("--units", choices=("submodules", "layers"), default="submodules")
    e.add_argument("--ahead", type=int, default=1)
    e.add_argument("--lora-rank", type=int, default=16)
    e.add_argument("--no-checkpointing", action="store_true")
    e.add_argument("--no-autocast", action="store_true")
    e.add_argument("--step-after-backward", action="store_true",
                   help="the gradients go home (the default steps in backward)")
    e.add_argument("--host-step", type=float, default=0.0,
                   help="the share of the streamed weights stepped on the host (their "
                        "gradients go home), as stream_optimizer's host_step")
    e.add_argument("--link-gbps", type=float, default=None,
                   help="the pinned rate to bound the time by (default: measured, if a GPU is here)")
    args = ap.parse_args(argv)
    try:
        est = estimate(args.config, task=args.task, budget=args.budget,
                       gpu_memory=args.gpu_memory, batch=args.batch,
                       seq=args.seq, new_tokens=args.new_tokens, dtype=args.dtype,
                       units=args.units, ahead=args.ahead, lora_rank=args.lora_rank,
                       checkpointing=not args.no_checkpointing, autocast=not args.no_autocast,
                       step_in_backward=not args.step_after_backward,
                       host_step=args.host_step,
                       link_gbps=args.link_gbps if args.link_gbps else "measure")
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(est.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
