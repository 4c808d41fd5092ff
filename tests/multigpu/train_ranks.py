"""One rank of a data-parallel training run, launched by torchrun (issue 21):

    torchrun --nproc-per-node 2 tests/multigpu/train_ranks.py --mode ddp --uvm 1 --out losses.json

Modes:
  ddp          DistributedDataParallel of a small transformer, each rank on its GPU
  fsdp2        the same model under fully_shard (FSDP2)
  ddp_offload  DDP where each rank's replica is offloaded with torch_uvm.offload
               under a budget of half the model, optimizer streamed
               (stream_optimizer): the path when the model does not fit one card
  ddp_resident the reference of ddp_offload: the same DDP, all resident
  fsdp2_offload        FSDP2 with CPUOffloadPolicy and fused CPU AdamW
  fsdp2_offload_steps  the same, each param group stepped on torch_uvm's host
                       worker in the backward (torch_uvm.fsdp.step_in_backward):
                       its losses and weights equal fsdp2_offload's bit for bit
  fsdp2_offload_local_steps  the same, the worker stepping local shards
                       (ShardSteps.on_local_shards): bit for bit too
  lightning_offload    Lightning's Trainer on the ranks, each rank's replica offloaded
                       by torch_uvm.lightning.OffloadDDPStrategy under half the model
  lightning_resident   its reference: the same Trainer with Lightning's DDP strategy
  accelerate_offload   accelerate's Accelerator (prepare, backward) over each rank's
                       replica offloaded under half the model, optimizer streamed
  accelerate_resident  its reference: the same loop, all resident

Every rank trains `--steps` steps on its own batch (seeded by rank) and rank 0
writes {"ranks": [{"losses", "params_sha1", "memory", "contexts", "pid", "device"}, ...],
"nvidia_smi": {pid: [GPUs]}} to --out: per rank, the bytes PyTorch's
statistics show on each GPU and the GPUs it holds a context on, and which
GPUs nvidia-smi sees each process on (a rank must be on its own GPU only). With --device cpu (gloo), the
DDP and fsdp2_offload modes run on the CPU: a check of this script that needs no GPU.
"""
import argparse
import ctypes
import hashlib
import json
import os
import subprocess

import torch
import torch.distributed as dist


def model_and_batches(seed_rank: int, device: torch.device, steps: int):
    torch.manual_seed(0)                       # the same replica on every rank
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=4),
                                torch.nn.Linear(256, 256))
    g = torch.Generator().manual_seed(1000 + seed_rank)   # each rank its own data
    batches = [(torch.randn(8, 64, 256, generator=g), torch.randn(8, 64, 256, generator=g))
               for _ in range(steps)]
    return model, [(x.to(device), y.to(device)) for x, y in batches]


def context_active(ordinal: int) -> bool:
    """Whether this process holds a context on GPU `ordinal` (the driver's
    answer: a rank that touched another GPU would hold one there)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
    return bool(active.value)


def gpus_by_pid() -> dict:
    """{pid: [GPU indices]} of the processes nvidia-smi sees ({} where it
    sees none, as in some containers)."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=60).stdout
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    index_of = {u.strip(): int(i) for i, u in (l.split(",") for l in gpus.splitlines() if l)}
    seen = {}
    for line in apps.splitlines():
        if "," in line:
            pid, uuid = (v.strip() for v in line.split(","))
            seen.setdefault(pid, []).append(index_of.get(uuid, -1))
    return seen


def half_budget(model) -> int:
    """The budget every offloaded mode streams its replica under: half the
    model's bytes."""
    return sum(p.numel() * p.element_size() for p in model.parameters()) // 2


def lightning_losses(model, batches, device, world: int, offload: bool) -> list:
    """Lightning's Trainer over `batches` (this rank's own: no distributed
    sampler) on the ranks torchrun made, with torch_uvm's OffloadDDPStrategy
    under half the model's bytes, or Lightning's own DDP; the losses this
    rank saw. Lightning's teardown moves the module to the CPU (which undoes
    the offload)."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy
    backend = "nccl" if device.type == "cuda" else "gloo"
    losses = []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)
    if offload:
        from torch_uvm.lightning import OffloadDDPStrategy
        strategy = OffloadDDPStrategy(budget=half_budget(model),
                                      ddp={"process_group_backend": backend})
    else:
        strategy = DDPStrategy(process_group_backend=backend)
    trainer = pl.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=world,
                         strategy=strategy, max_steps=len(batches), use_distributed_sampler=False,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Module(), torch.utils.data.DataLoader(batches, batch_size=None))
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["ddp", "fsdp2", "ddp_offload", "ddp_resident",
                                       "fsdp2_offload", "fsdp2_offload_steps",
                                       "fsdp2_offload_local_steps",
                                       "lightning_offload", "lightning_resident",
                                       "accelerate_offload", "accelerate_resident"],
                    required=True)
    ap.add_argument("--uvm", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.uvm:
        import torch_uvm
        torch_uvm.set_enabled_uvm(True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    model, batches = model_and_batches(rank, device, args.steps)
    handle = None
    # (ranks on the CPU name their mesh: FSDP2's default takes the GPUs
    # where CUDA is, and a machine with fewer GPUs than ranks refuses it)
    mesh = None
    if args.mode.startswith("fsdp2") and device.type == "cpu":
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
    if args.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        model.to(device)
        for block in model[0].layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    elif args.mode.startswith("fsdp2_offload"):
        # FSDP2's CPUOffloadPolicy: shards, gradients and states in host memory,
        # PyTorch's fused CPU AdamW; _steps: each group stepped on torch_uvm's
        # worker in the backward (fsdp.step_in_backward)
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        policy = CPUOffloadPolicy(pin_memory=device.type == "cuda")
        model.to(device)
        for block in model[0].layers:
            fully_shard(block, offload_policy=policy, mesh=mesh)
        fully_shard(model, offload_policy=policy, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        if args.mode.endswith("_steps"):
            import torch_uvm.fsdp
            steps = torch_uvm.fsdp.step_in_backward(model, optimizer)
            steps.on_local_shards = args.mode.endswith("_local_steps")
    elif args.mode == "ddp_offload":
        import torch_uvm
        handle = torch_uvm.offload(model, budget=half_budget(model), device=device)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
        optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    elif args.mode.startswith("lightning"):      # its own loop: the losses it saw
        lightning_seen = lightning_losses(model, batches, device, world,
                                  args.mode == "lightning_offload")
    elif args.mode.startswith("accelerate"):
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=device.type == "cpu")
        if args.mode == "accelerate_offload":
            import torch_uvm
            handle = torch_uvm.offload(model, budget=half_budget(model),
                                       device=accelerator.device)
            optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
        else:
            model.to(accelerator.device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        prepared, optimizer = accelerator.prepare(model, optimizer)
    else:
        model.to(device)
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # FSDP2's offload modes on a GPU: the GPU a tenth of a second behind the
    # host at each backward, so the backward's hooks run before the gradients'
    # copies home land; a step that reads a gradient before its copy reads
    # what the host memory held before (both modes sleep alike)
    behind = args.mode.startswith("fsdp2_offload") and device.type == "cuda"
    losses = lightning_seen if args.mode.startswith("lightning") else []
    for x, y in ([] if args.mode.startswith("lightning") else batches):
        if args.mode.startswith("accelerate"):
            loss = torch.nn.functional.mse_loss(prepared(x), y)
            accelerator.backward(loss)
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
            if behind:
                torch.cuda._sleep(1 << 28)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # (each rank's own shard or replica: no collective, whatever device it is on)
    mine = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    digest = hashlib.sha1(b"".join(p.detach().cpu().contiguous().numpy().tobytes()
                                   for p in mine)).hexdigest()
    memory, contexts = {}, {}
    if device.type == "cuda":
        torch.cuda.synchronize()
        memory = {f"cuda:{d}": torch.cuda.memory_allocated(d)
                  for d in range(torch.cuda.device_count())}
        contexts = {f"cuda:{d}": context_active(d) for d in range(torch.cuda.device_count())}
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "losses": losses, "params_sha1": digest,
                                      "memory": memory,
                                      "contexts": contexts, "pid": os.getpid(),
                                      "device": str(device)})
    if rank == 0:   # every rank still holds its memory: the others wait at the barrier
        smi = gpus_by_pid() if device.type == "cuda" else {}
        with open(args.out, "w") as f:
            json.dump({"mode": args.mode, "uvm": args.uvm, "ranks": gathered,
                       "nvidia_smi": smi}, f, indent=1)
    dist.barrier()
    if handle is not None:
        handle.undo()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
