"""Checks on CPU/gloo (2 ranks) for the recommended design's gradient path:
the sharded param's post-accumulate-grad hook (called by FSDP2's foreach_reduce)
replaces p.grad with a DTensor over memory the library owns ("grad home");
FSDP2 accumulates into it over 2 microbatches; AdamW then steps.
Also: a step inside the hook (step in backward) on reduced grads."""
import os, sys, socket, traceback
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

def make():
    torch.manual_seed(0); return nn.Sequential(nn.Linear(8, 9), nn.ReLU(), nn.Linear(9, 8))

def worker(rank, ws, port, mode, q):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=ws)
        mesh = init_device_mesh("cpu", (ws,))
        ref, model = make(), make()
        for b in (model[0], model[2]): fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        params = list(model.parameters())
        homes, seen = {}, []
        opt = torch.optim.AdamW(params, lr=0.1)
        def hook(p):
            g = p.grad
            seen.append(g.to_local().untyped_storage().nbytes())
            if mode == "gradhome":
                h = homes.get(p)
                if h is None:
                    h = homes[p] = torch.empty_like(g.to_local())   # its own storage, offset 0
                    h.copy_(g.to_local())
                    p.grad = DTensor.from_local(h, g.device_mesh, g.placements, shape=g.shape, stride=g.stride(), run_check=False)
                # else FSDP2 already accumulated into the home in place (+=)
            elif mode == "step_in_backward":
                # one parameter's own step on its reduced gradient, then the gradient goes
                saved = [gr["params"] for gr in opt.param_groups]
                for gr in opt.param_groups: gr["params"] = [x for x in gr["params"] if x is p]
                opt.step()
                for gr, s in zip(opt.param_groups, saved): gr["params"] = s
                p.grad = None
        for p in params: p.register_post_accumulate_grad_hook(hook)
        ropt = torch.optim.AdamW(ref.parameters(), lr=0.1)
        for step in range(2):
            for micro in range(2 if mode == "gradhome" else 1):
                torch.manual_seed(100 * step + 10 * micro + rank); x = torch.randn(4, 8)
                xs = [torch.zeros_like(x) for _ in range(ws)]; dist.all_gather(xs, x)
                model(x).sum().backward()
                (sum(ref(xi).sum() for xi in xs) / ws).backward()
            if mode == "gradhome":
                same = all(p.grad.to_local().untyped_storage().data_ptr() == homes[p].untyped_storage().data_ptr() for p in params)
                opt.step(); opt.zero_grad(set_to_none=False)   # the homes stay, zeroed
            else:
                same = all(p.grad is None for p in params)
            ropt.step(); ropt.zero_grad()
        ok = all(torch.allclose(p.full_tensor(), r, atol=1e-5) for p, r in zip(params, ref.parameters()))
        q.put((rank, f"mode={mode} matches_ref={ok} grads_kept_in_home_or_none={same} hook_calls={len(seen)} flat_grad_storage_bytes={sorted(set(seen))}"))
    except Exception:
        q.put((rank, traceback.format_exc()[-1200:]))
    finally:
        if dist.is_initialized(): dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("spawn"); q = ctx.SimpleQueue()
    ps = [ctx.Process(target=worker, args=(r, 2, port, sys.argv[1], q)) for r in range(2)]
    [p.start() for p in ps]; res = [q.get() for _ in ps]; [p.join(30) for p in ps]
    print(torch.__version__, *sorted(res), sep="\n  ")
