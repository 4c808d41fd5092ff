"""Does a thread stepping AdamW leave the GIL to the others? A loop of small
torch ops on the main thread, timed alone and beside a thread that runs
fused CPU AdamW again and again over 4 M elements: on plain tensors, on
DTensors (one-rank gloo mesh), and on DTensors through
narrowed_step.step_over(on_local_shards=True), as FSDP2's host worker does
with ShardSteps.on_local_shards. Prints the loop's seconds each way.

    python scripts/dtensor_gil.py"""
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_uvm.narrowed_step import step_over  # noqa: E402

N = 4_000_000


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    s.close()
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    torch.set_num_threads(1)

    def optimizer(dtensor: bool):
        p = torch.randn(N)
        p = torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)]) if dtensor else p)
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
        p.grad = torch.randn_like(p)
        opt.step()          # (its states made)
        return opt, p

    def loop() -> float:
        x = torch.zeros(8)
        t = time.perf_counter()
        for _ in range(3000):
            x.add_(1)
            (x * 2).sum()
        return time.perf_counter() - t

    print(f"torch {torch.__version__}, {os.cpu_count()} cores; the main thread's loop of small ops:")
    print(f"  alone: {loop():.3f} s")
    for name, dtensor, local in [("plain tensors", False, False), ("DTensors", True, False),
                                 ("DTensors, on their local shards", True, True)]:
        opt, p = optimizer(dtensor)
        stop = threading.Event()

        def steps():
            while not stop.is_set():
                step_over(opt, opt.step, {id(p)}, {}, local)
        worker = threading.Thread(target=steps)
        worker.start()
        time.sleep(0.2)
        print(f"  beside AdamW on {name}: {loop():.3f} s")
        stop.set()
        worker.join()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
