"""FSDP2 on the CPU with gloo: 2 ranks spawned by torch.multiprocessing.
Each case: fully_shard two Linear blocks + root, forward/backward/AdamW step,
compared to an unsharded reference (grads averaged over ranks).
Usage: python run.py CASE   (CASE: default | cpu_offload | cpu_offload_nopin | mp_bf16 | probes)"""
import os, sys, socket, traceback, time
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, FSDPModule, CPUOffloadPolicy, MixedPrecisionPolicy

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def make():
    torch.manual_seed(0)
    # 9 rows: uneven shards over 2 ranks (padding)
    return nn.Sequential(nn.Linear(8, 9), nn.ReLU(), nn.Linear(9, 8))

def groups(state):  # 2.14: _fsdp_param_groups; 2.11: _fsdp_param_group
    gs = getattr(state, "_fsdp_param_groups", None)
    if gs is None:
        g = state._fsdp_param_group
        gs = [g] if g is not None else []
    return gs

def worker(rank, ws, port, case, q):
    def log(*a): print(f"[r{rank}]", *a, file=sys.stderr, flush=True)
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=ws)
        mesh = init_device_mesh("cpu", (ws,))
        ref = make(); model = make()
        kw = {}
        if case == "cpu_offload": kw["offload_policy"] = CPUOffloadPolicy()
        if case == "cpu_offload_nopin": kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        if case == "mp_bf16": kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        blocks = [model[0], model[2]]
        for b in blocks: fully_shard(b, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
        out = {}
        sharded = list(model.parameters())
        out["param_types"] = sorted({type(p).__name__ for p in sharded})
        out["local_devices"] = sorted({str(p.to_local().device) for p in sharded})
        if case == "probes":
            fp = groups(blocks[0]._get_fsdp_state())[0].fsdp_params[0]   # weight 9x8: uneven
            p = fp.sharded_param
            with torch.no_grad(): loc = p.to_local()
            out["to_local_is_local_tensor_no_grad"] = loc is p._local_tensor
            loc_g = p.to_local()
            out["to_local_shares_storage_grad_mode"] = loc_g.untyped_storage().data_ptr() == fp._sharded_param_data.untyped_storage().data_ptr()
            out["storage_nbytes_vs_padded"] = (loc.untyped_storage().nbytes(), fp._sharded_param_data.numel() * 4, loc.numel() * 4)
            # order of a prepended pre-hook vs FSDP2's
            seen = []
            def uvm_pre(m, a):
                seen.append(("uvm_pre", [g.is_sharded for g in groups(m._get_fsdp_state())]))
            def uvm_pre_late(m, a):
                seen.append(("uvm_pre_appended", [g.is_sharded for g in groups(m._get_fsdp_state())]))
            for b in blocks:
                b.register_forward_pre_hook(uvm_pre, prepend=True)
                b.register_forward_pre_hook(uvm_pre_late)
            # the sharded param's post-accumulate-grad hook (called by foreach_reduce)
            calls = []
            def pag(p):
                calls.append((tuple(p.grad.to_local().shape), type(p.grad).__name__,
                              p.grad.to_local().untyped_storage().nbytes(), p.grad.to_local().storage_offset()))
            for p in sharded: p.register_post_accumulate_grad_hook(pag)
            # a post hook on the sharded param's AccumulateGrad node (what
            # torch_uvm's C++ gradient hooks use) -- does autograd run it?
            acc_calls = []
            accs = []
            for p in sharded:
                acc = p.view_as(p).grad_fn.next_functions[0][0]
                accs.append(acc)
                acc.register_hook(lambda *a: acc_calls.append(1))
            out["accumulate_grad_nodes"] = type(accs[0]).__name__
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        ropt = torch.optim.AdamW(ref.parameters(), lr=0.1)
        torch.manual_seed(1 + rank)
        x = torch.randn(4, 8)
        xs = [torch.zeros_like(x) for _ in range(ws)]; dist.all_gather(xs, x)
        for step in range(2):
            log("step", step)
            if case == "probes" and step == 1:
                # replace each shard's memory between steps (same StorageImpl,
                # new data pointer: what torch_uvm's point_at does)
                with torch.no_grad():
                    for p in sharded:
                        s = p.to_local().untyped_storage()
                        keep = torch.empty(s.nbytes(), dtype=torch.uint8); keep.untyped_storage().copy_(s)
                        old = s.data_ptr(); s.resize_(0); s.resize_(keep.numel()); s.copy_(keep.untyped_storage())
                out["repointed"] = True
            loss = model(x).sum()
            loss.backward()
            opt.step(); opt.zero_grad()
            # reference: mean over the ranks' batches = FSDP2's averaged gradient
            rl = sum(ref(xi).sum() for xi in xs) / ws
            rl.backward(); ropt.step(); ropt.zero_grad()
        ok = True
        for p, rp in zip(model.parameters(), ref.parameters()):
            full = p.full_tensor()
            tol = 5e-2 if case == "mp_bf16" else 1e-5
            ok &= torch.allclose(full.float(), rp, atol=tol)
        out["match_ref_after_2_steps"] = bool(ok)
        out["grad_local_device"] = None
        loss = model(x).sum(); loss.backward()
        g = sharded[0].grad
        out["grad_type_device_pinned"] = (type(g).__name__, str(g.to_local().device), g.to_local().is_pinned() if g.to_local().device.type == "cpu" else None)
        out["state_types"] = sorted({type(v).__name__ for s in opt.state.values() for v in s.values()})
        if case == "probes":
            out["pre_hook_order_first_fwd"] = seen[:4]
            out["post_acc_grad_hook_calls(per bwd=4)"] = len(calls)
            out["post_acc_grad_hook_first"] = calls[0] if calls else None
            out["AccumulateGrad_post_hook_calls"] = len(acc_calls)
            # state dict: DTensor shards
            log("state_dict"); sd = model.state_dict()
            out["state_dict_types"] = sorted({type(v).__name__ for v in sd.values()})
            # emptied shard then state_dict (what happens if a library frees the shard)
            s = sharded[0].to_local().untyped_storage(); keep = torch.empty(s.nbytes(), dtype=torch.uint8); keep.untyped_storage().copy_(s)
            s.resize_(0); log("emptied")
            try:
                sd = model.state_dict(); v = sd["0.weight"].to_local(); out["state_dict_on_emptied"] = f"ok numel={v.numel()} storage={v.untyped_storage().nbytes()}"
                log(out["state_dict_on_emptied"])
                if os.environ.get("READ_EMPTIED"):
                    v.sum(); out["read_emptied"] = "no error?"
            except Exception as e:
                out["state_dict_on_emptied"] = type(e).__name__ + ": " + str(e)[:160]
            s.resize_(keep.numel()); s.copy_(keep.untyped_storage())
            # set_post_optim_event on cpu
            try:
                ev = torch.Event("cpu"); ev.record(); model.set_post_optim_event(ev); model(x); out["post_optim_event_cpu"] = "ok"
            except Exception as e:
                out["post_optim_event_cpu"] = type(e).__name__ + ": " + str(e)[:160]
        q.put((rank, "ok", out))
    except Exception as e:
        q.put((rank, "error", traceback.format_exc()[-1500:]))
    finally:
        if dist.is_initialized(): dist.destroy_process_group()

if __name__ == "__main__":
    case = sys.argv[1]
    t = time.time()
    ctx = mp.get_context("spawn"); q = ctx.SimpleQueue()
    port = free_port()
    ps = [ctx.Process(target=worker, args=(r, 2, port, case, q)) for r in range(2)]
    for p in ps: p.start()
    res = []
    deadline = time.time() + 50
    while len(res) < len(ps) and time.time() < deadline:
        if not q.empty(): res.append(q.get()); continue
        if any(p.exitcode not in (None, 0) for p in ps): time.sleep(1);
        if any(p.exitcode not in (None, 0) for p in ps) and q.empty(): break
        time.sleep(0.1)
    for p in ps:
        p.join(5)
        if p.is_alive(): p.kill()
    print("exitcodes", [p.exitcode for p in ps])
    print(f"== torch {torch.__version__} case={case} ({time.time()-t:.1f}s)")
    for r in sorted(res, key=lambda x: x[0]):
        if r[1] == "ok":
            for k, v in r[2].items(): print(f"  rank{r[0]} {k}: {v}")
        else:
            print(f"  rank{r[0]} ERROR:\n{r[2]}")
