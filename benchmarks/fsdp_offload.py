"""FSDP2's offload across ranks, with and without torch_uvm's host steps in
backward (issue 57): tokens/s per GPU, each rank's process GPU memory, the
host's memory, and the per-GPU link limit, at 1, 2 or 4 GPUs.

    python benchmarks/fsdp_offload.py --gpus 2 [--rounds 3] [--shape 3b] [--out DIR]
    python benchmarks/fsdp_offload.py --gpus 2 --cpu --shape tiny   (gloo ranks, a smoke run)

Each variant runs as one torchrun launch of --gpus ranks (fresh processes),
the variants interleaved round by round:
- fsdp2_cpu_offload: FSDP2's CPUOffloadPolicy (shards, gradients and AdamW's
  states in pinned host memory), PyTorch's fused CPU AdamW after backward;
- fsdp2_cpu_offload_uvm_steps: the same, each param group stepped on
  torch_uvm's host worker as soon as its gradients are home
  (torch_uvm.fsdp.step_in_backward): the same arithmetic, checked bit for bit;
- the two again with FSDP2's MixedPrecisionPolicy (_bf16: bf16 gathered and
  computed, fp32 reduced);
- fsdp2_cpu_offload_bf16_uvm_local_steps: the worker steps each group's
  local shards, not its DTensors (ShardSteps.on_local_shards): the GIL
  free while the kernel runs;
- fsdp2_resident: FSDP2 without offload, where it fits (more memory);
- deepspeed_zero3_offload_bf16: DeepSpeed ZeRO-3 with parameters and
  optimizer offloaded (pinned), bf16 gathered and computed over fp32
  master weights, DeepSpeedCPUAdam, at most DEEPSPEED_LIVE elements live;
  its wheels are carried (docs/development.md). DeepSpeed's engine turns
  the outer autocast off (no torch_autocast section): its model computes in
  bf16 throughout, near but not the arithmetic of the _bf16 variants.

The model: a Llama of offload_llama's shapes (fp32 master weights, bf16
autocast, activation checkpointing), batch 4 x 1024 tokens on every rank.
The per-GPU link limit: each rank's shard of the weights must come to its
GPU at least once a step and its gradients' shard go home once, at the
pinned rates measured in the same run, both ways at once:
W / world / min(h2d, d2h) (fp32 shards; a bf16 cast made on the host would
halve it). The host's AdamW steps every rank's shard on one host: W / 4
elements at the fused CPU AdamW's rate measured beside it, on all cores.
Each rank gets its share of the cores (torchrun would give it one); the
_uvm_steps variants' host worker takes that share but two
(host_step.rank_threads(), recorded as each rank's host_step_threads).
The twins' losses are bit for bit only with deterministic kernels
(OFFLOAD_DETERMINISTIC=1: eager attention too); otherwise the check says
how far apart they are. Prints a table and writes
fsdp_offload-<G>gpu-<shape>.json and .png to --out; --append adds rounds to
that file's (one device call a round, say). FSDP_STEPS sets the steps of a
launch (default 5); a step's time is the median over all but the first.
Each step is also split where the CPU sees it: the forward returning, the
backward returning, the step and zero_grad returning (`phases`). --profile adds one step after
the timed ones, under torch.profiler on each rank and not timed: where its
time went on the GPU (profile_summary), printed beside the table."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import method  # noqa: E402

VARIANTS = ["fsdp2_cpu_offload", "fsdp2_cpu_offload_uvm_steps",
            "fsdp2_cpu_offload_bf16", "fsdp2_cpu_offload_bf16_uvm_steps"]
# (DeepSpeed comes as wheels: docs/development.md; its CPU Adam compiles at first use)
EXTRA = ["fsdp2_cpu_offload_bf16_uvm_local_steps", "fsdp2_resident",
         "deepspeed_zero3_offload_bf16"]
# DeepSpeed ZeRO-3's live parameters, in elements (stage3_max_live_parameters)
DEEPSPEED_LIVE = 1 << 30
# each variant stepped in backward by torch_uvm, and FSDP2's own: bit for bit
TWINS = {"fsdp2_cpu_offload_uvm_steps": "fsdp2_cpu_offload",
         "fsdp2_cpu_offload_bf16_uvm_steps": "fsdp2_cpu_offload_bf16",
         "fsdp2_cpu_offload_bf16_uvm_local_steps": "fsdp2_cpu_offload_bf16"}
# and the other offloading anchor of the same training (bf16 gathered, fp32 master)
ANCHORS = {"fsdp2_cpu_offload_bf16_uvm_steps": "deepspeed_zero3_offload_bf16",
           "fsdp2_cpu_offload_bf16_uvm_local_steps": "deepspeed_zero3_offload_bf16"}
STEPS, BATCH, SEQ, LR = int(os.environ.get("FSDP_STEPS", "5")), 4, 1024, 1e-4


def build(shape: str, device):
    """The Llama, its batch and its loss on this rank (the batch seeded by rank)."""
    import torch
    import torch.distributed as dist
    import offload_llama
    extra = {"attn_implementation": "eager"} if method.DETERMINISTIC else {}
    model = offload_llama.build(shape == "tiny", shape="7b" if shape == "tiny" else shape,
                                dtype=torch.float32, fill=device.type,   # (drawn on the rank's GPU)
                                **extra)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    seq = 64 if shape == "tiny" else SEQ
    x = torch.randint(0, model.config.vocab_size, (BATCH, seq),
                      generator=torch.Generator().manual_seed(1 + dist.get_rank())).to(device)

    def loss_fn(m):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return m(input_ids=x, labels=x).loss
    return model, x, loss_fn


def profile_summary(trace: dict, wall_s: float) -> dict:
    """Where a profiled step's time went on the GPU, from its Chrome trace
    (torch.profiler's export): the copies to the GPU and home (count,
    bytes, the seconds some such copy ran, GB/s over them), and the seconds some compute
    kernel, or some NCCL kernel, ran (their spans' union), beside the
    step's wall time. And the host's AdamW (CPU ops named *adamw*, on any
    thread): the seconds some such op ran, and each direction's copies that
    ran at least half their time beside it (`beside_adamw`, their GB/s), to
    tell whether the host's memory slows the copies the GPU waits on."""
    def disjoint(spans):           # (the spans merged where they overlap)
        out = []
        for a, b in sorted(spans):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return out

    def union(spans):              # (seconds; overlaps counted once)
        return sum(b - a for a, b in disjoint(spans)) / 1e6

    def overlap(a, b, spans):      # (of [a, b] with the sorted, disjoint spans)
        return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans)

    def rate(n, nbytes, spans):
        secs = union(spans)          # (copies on several streams: once)
        return {"copies": n, "bytes": nbytes, "seconds": secs,
                "gbps": nbytes / secs / 1e9 if secs else None}
    copies = {"to_gpu": [], "home": []}
    compute, nccl, adamw = [], [], []
    for e in trace.get("traceEvents", []):
        cat, name, dur = e.get("cat", ""), e.get("name", ""), e.get("dur")
        if dur is None:
            continue
        span = (e["ts"], e["ts"] + dur)
        if cat == "gpu_memcpy" and ("HtoD" in name or "DtoH" in name):
            copies["to_gpu" if "HtoD" in name else "home"].append(
                (span, int(e.get("args", {}).get("bytes", 0))))
        elif cat == "kernel":
            (nccl if "nccl" in name.lower() else compute).append(span)
        elif cat == "cpu_op" and "adamw" in name.lower():
            adamw.append(span)
    adamw = disjoint(adamw)
    out = {"wall_s": wall_s, "compute_s": union(compute), "nccl_s": union(nccl),
           "adamw_s": union(adamw)}
    for k, cs in copies.items():
        out[k] = rate(len(cs), sum(n for _, n in cs), [s for s, _ in cs])
        beside = [(s, n) for s, n in cs if 2 * overlap(*s, adamw) >= s[1] - s[0]]
        out[k]["beside_adamw"] = rate(len(beside), sum(n for _, n in beside),
                                      [s for s, _ in beside])
    return out


def profiled_step(variant, model, optimizer, loss_fn, offload_train) -> dict:
    """One more step under torch.profiler (CPU and CUDA; every thread, the
    host worker's too, and the CUDA synchronizations, where this torch
    can): profile_summary of it. With FSDP_TRACE_DIR set, rank 0 keeps its
    trace there, gzipped (<variant>-rank0-<ns>.json.gz)."""
    import gzip
    import shutil
    import tempfile
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    try:
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True,
                                                        enable_cuda_sync_events=True)
    except (AttributeError, TypeError):        # (an older torch: the profiling thread's alone)
        config = None
    with profile(activities=activities, experimental_config=config) as prof:
        t0 = time.perf_counter()
        loss = loss_fn(model)
        offload_train.train_step(variant, model, optimizer, loss)
        loss.item()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        keep = os.environ.get("FSDP_TRACE_DIR")
        if keep and (not dist.is_initialized() or dist.get_rank() == 0):
            os.makedirs(keep, exist_ok=True)
            name = f"{variant}-rank0-{time.time_ns()}.json.gz"     # (one a launch)
            with open(path, "rb") as f, gzip.open(os.path.join(keep, name), "wb") as g:
                shutil.copyfileobj(f, g)
        with open(path) as f:
            return profile_summary(json.load(f), wall)


def rank_main(variant: str, shape: str, out: str, profiled: bool = False) -> None:
    """One rank of `variant` (under torchrun); rank 0 writes `out`. With
    `profiled`, one step more under torch.profiler (profiled_step)."""
    import torch
    import torch.distributed as dist
    import offload_train
    method.deterministic_kernels()
    cuda = torch.cuda.is_available() and os.environ.get("FSDP_OFFLOAD_CPU") != "1"
    gpu = None
    if cuda:        # (measured from before NCCL starts: its buffers are the process's)
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        gpu = method.ProcessGpuMemory(device=device.index)
        gpu.__enter__()
        dist.init_process_group("cuda:nccl,cpu:gloo", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    model, x, loss_fn = build(shape, device)
    weights = sum(p.numel() for p in model.parameters()) * 4     # (before ZeRO-3 partitions)
    if variant.startswith("deepspeed"):
        # ZeRO-3 with parameters and optimizer offloaded, bf16 gathered and computed,
        # fp32 master weights and states (offload_train.deepspeed_config: its docs' tuning)
        import deepspeed
        config = offload_train.deepspeed_config(3, DEEPSPEED_LIVE * 4, model.config.hidden_size,
                                                LR, bf16=True)
        model, optimizer, _, _ = deepspeed.initialize(model=model, config=config,
                                                      model_parameters=model.parameters())
    else:
        if variant == "fsdp2_resident":
            model.to(device)
        from torch.distributed.device_mesh import init_device_mesh
        offload_train.shard(model, offload=variant.startswith("fsdp2_cpu_offload"),
                            bf16="_bf16" in variant, pin_memory=cuda,
                            mesh=None if cuda else init_device_mesh("cpu",
                                                                    (dist.get_world_size(),)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    host_threads = shard_steps = None
    if variant.endswith(("_uvm_steps", "_uvm_local_steps")):
        import torch_uvm.fsdp
        shard_steps = torch_uvm.fsdp.step_in_backward(model, optimizer)
        shard_steps.on_local_shards = variant.endswith("_local_steps")
        host_threads = shard_steps.threads
    losses, times, worker, phases = [], [], [], []
    for _ in range(STEPS):
        before = shard_steps.stats() if shard_steps else None
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        loss = loss_fn(model)
        marks = [time.perf_counter()]
        offload_train.train_step(variant, model, optimizer, loss, marks)
        losses.append(loss.item())
        end = time.perf_counter()
        times.append(end - t0)
        phases.append({"forward_s": marks[0] - t0, "backward_s": marks[1] - marks[0],
                       "step_s": end - marks[1]})
        if shard_steps:      # (the host worker's seconds and the caller's wait, this step)
            after = shard_steps.stats()
            worker.append({k: after[k] - before[k] for k in after})
    if gpu is not None:
        gpu.__exit__(None, None, None)
    if profiled:        # (after the memory's window; the host peak counts the profiler's)
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        profiled = profiled_step(variant, model, optimizer, loss_fn, offload_train)
    else:
        profiled = None
    mine = {"rank": dist.get_rank(), "losses": losses, "times_s": times,
            "threads": torch.get_num_threads(), "host_step_threads": host_threads,
            "host_worker": worker, "phases": phases, "profiled_step": profiled,
            "process_gpu_memory": gpu.result() if gpu is not None else None,
            "host_peak_bytes": method.host_peak_bytes()}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if dist.get_rank() == 0:
        steady = sorted(max(r["times_s"][i] for r in ranks) for i in range(1, STEPS))
        with open(out, "w") as f:
            json.dump({"variant": variant, "world": dist.get_world_size(), "ranks": ranks,
                       "s_per_step": steady[len(steady) // 2], "weights_bytes": weights,
                       "tokens_per_step_per_rank": x.numel(), "shape": shape,
                       "batch": x.shape[0], "seq": x.shape[1], "steps": STEPS,
                       "deterministic": method.DETERMINISTIC}, f)
    dist.barrier()
    dist.destroy_process_group()


def launch(variant: str, gpus: int, shape: str, cpu: bool, folder: str,
           timeout: int, profiled: bool = False) -> dict:
    """One torchrun launch of `variant`: rank 0's result, or None."""
    out = os.path.join(folder, f"{variant}-{time.time_ns()}.json")
    env = dict(os.environ, FSDP_OFFLOAD_CPU="1" if cpu else "0",
               NCCL_NVLS_ENABLE="0",       # (the device README: NVLink multicast off)
               # each rank its share of the cores (torchrun's default is one)
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // gpus)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={gpus}", os.path.abspath(__file__), "--rank-of", variant,
           "--shape", shape, "--result", out] + (["--profile"] if profiled else [])
    t0 = time.time()
    # (a session of its own: a launch past its time is killed with its ranks)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        print(f"    {variant}: TIMED OUT after {timeout} s (its ranks killed)", flush=True)
        return None
    if p.returncode != 0 or not os.path.exists(out):
        print(f"    {variant}: FAILED\n{stdout[-1500:]}\n{stderr[-3000:]}", flush=True)
        return None
    with open(out) as f:
        r = json.load(f)
    print(f"    {variant}: {r['s_per_step']:.3f} s a step ({time.time() - t0:.0f} s)", flush=True)
    return r


def stem(gpus: int, shape: str) -> str:
    return f"fsdp_offload-{gpus}gpu-{shape}"


def report(runs: dict, rates: list, gpus: int, out: str, shape: str = "3b") -> dict:
    """The table, and its JSON and plot (stem()) in `out`."""
    ok = next((r for rs in runs.values() for r in rs if r), None)
    h2d = method.summarize([r["h2d_gbps"] for r in rates if r and "h2d_gbps" in r])
    d2h = method.summarize([r["d2h_gbps"] for r in rates if r and "d2h_gbps" in r])
    adamw = method.summarize([r["host_adamw_elements_per_s"] for r in rates
                              if r and "host_adamw_elements_per_s" in r])
    link = host = None
    if ok and h2d and d2h:
        link = ok["weights_bytes"] / gpus / (min(h2d["median"], d2h["median"]) * 1e9)
    if ok and adamw:
        host = ok["weights_bytes"] / 4 / adamw["median"]
    print(f"\n{gpus} ranks; per-GPU link limit "
          f"{'—' if link is None else f'{link:.3f} s'}, the host's AdamW of every shard "
          f"{'—' if host is None else f'{host:.3f} s'} a step")
    print("| variant | tokens/s per GPU (median, min–max) | s a step | x the larger limit | "
          "process GPU memory per rank | host peak, all ranks | same losses as |")
    print("|---|---|---|---|---|---|---|")
    table = {}
    for v, rs in runs.items():
        done = [r for r in rs if r]
        if not done:
            print(f"| {v} | failed | | | | | |")
            continue
        tps = method.summarize([r["tokens_per_step_per_rank"] / r["s_per_step"] for r in done])
        secs = method.summarize([r["s_per_step"] for r in done])
        least = max(x for x in (link, host) if x is not None) if (link or host) else None
        peaks = [rank["process_gpu_memory"]["peak_bytes"] for r in done for rank in r["ranks"]
                 if rank["process_gpu_memory"]]
        host_peak = max(sum(rank["host_peak_bytes"] for rank in r["ranks"]) for r in done)
        twin = TWINS.get(v)
        same = None
        if twin and any(runs.get(twin, [])):   # (bit for bit with deterministic kernels)
            theirs = next(r for r in runs[twin] if r)
            same = [rank["losses"] for rank in done[-1]["ranks"]] == \
                [rank["losses"] for rank in theirs["ranks"]]
        x = secs["median"] / least if least else None
        table[v] = {"tokens_per_s_per_gpu": tps, "s_per_step": secs, "x_larger_limit": x,
                    "process_gpu_peak_bytes": max(peaks) if peaks else None,
                    "host_peak_bytes": host_peak, "same_losses_as_twin": same}
        x_cell = "—" if x is None else f"{x:.2f}"
        gpu_cell = f"{method.gib_cell(max(peaks))} GiB" if peaks else "—"
        same_cell = "—" if same is None else f"{twin}: {same}"
        print(f"| {v} | {tps['median']:.0f} ({tps['min']:.0f}–{tps['max']:.0f}) | "
              f"{secs['median']:.3f} | {x_cell} | {gpu_cell} | "
              f"{method.gib_cell(host_peak)} GiB | {same_cell} |")
    for v, rs in runs.items():        # each phase of the steady steps, the slower rank's
        steady = [[rank["phases"][i] for rank in r["ranks"]] for r in rs if r
                  for i in range(1, len(r["ranks"][0].get("phases") or []))]
        if steady:
            got = {k: method.summarize([max(p[k] for p in ranks) for ranks in steady])
                   for k in ("forward_s", "backward_s", "step_s")}
            table[v]["phases"] = got
            print(f"  {v}: the forward returned after {got['forward_s']['median']:.3f} s, the "
                  f"backward {got['backward_s']['median']:.3f} s after it, the step and zero_grad "
                  f"{got['step_s']['median']:.3f} s after that (medians; the CPU's view, the "
                  f"GPU's work may end later)")
    for v, rs in runs.items():        # where a host worker's step time went
        steady = [w for r in rs if r for rank in r["ranks"]
                  for w in (rank.get("host_worker") or [])[1:]]
        if steady:
            host = method.summarize([w["host_seconds"] for w in steady])
            waited = method.summarize([w["waited_seconds"] for w in steady])
            threads = sorted({rank["host_step_threads"] for r in rs if r for rank in r["ranks"]
                              if rank.get("host_step_threads") is not None})
            table[v]["host_worker"] = {"host_seconds": host, "waited_seconds": waited,
                                       "threads": threads}
            print(f"  {v}: each rank's worker stepped its groups in {host['median']:.3f} s a "
                  f"step ({host['min']:.3f}–{host['max']:.3f}) on {threads} threads; the "
                  f"rank's thread waited {waited['median']:.3f} s for them "
                  f"({waited['min']:.3f}–{waited['max']:.3f})")
    for v, rs in runs.items():        # where a profiled step's time went on the GPU
        steps = [(rank["rank"], rank["profiled_step"]) for r in rs if r for rank in r["ranks"]
                 if rank.get("profiled_step")]
        if steps:
            table[v]["profiled_steps"] = [p for _, p in steps]
        last = next((r for r in reversed(rs) if r and any(rank.get("profiled_step")
                                                           for rank in r["ranks"])), None)
        for rank, p in ([] if last is None else [(x["rank"], x["profiled_step"])
                                                 for x in last["ranks"]]):
            def moved(c):
                return (f"{c['bytes'] / 1e9:.1f} GB in {c['seconds']:.3f} s"
                        + (f" ({c['gbps']:.1f} GB/s)" if c["gbps"] else ""))
            print(f"  {v}, a profiled step, rank {rank}: {p['wall_s']:.3f} s; compute kernels "
                  f"{p['compute_s']:.3f} s, NCCL {p['nccl_s']:.3f} s, CPU ops named adamw "
                  f"{p.get('adamw_s', 0):.3f} s; " + "; ".join(
                      f"{k.replace('_', ' ')} {moved(p[k])}"
                      + (f", of it beside the AdamW {moved(p[k]['beside_adamw'])}"
                         if p[k].get("beside_adamw", {}).get("copies") else "")
                      for k in ("to_gpu", "home")))
    compared = {f"{v} / {t}, s a step": method.ratio(
        [r and r["s_per_step"] for r in runs[v]], [r and r["s_per_step"] for r in runs[t]])
        for v, t in [*TWINS.items(), *ANCHORS.items()] if v in runs and t in runs}
    method.print_comparisons(compared)
    os.makedirs(out, exist_ok=True)
    print("  (the link limit counts fp32 shards: for the _bf16 variants a cast made on the "
          "host would halve it)")
    method.write(os.path.join(out, stem(gpus, shape) + ".json"), compared, gpus=gpus,
                 shape=shape, table=table, runs=runs, rates=rates, link_limit_s=link,
                 host_adamw_s=host)
    plt = method.pyplot()
    if plt is not None and table:
        names = list(table)
        fig, ax = plt.subplots(figsize=(8, 1 + 0.5 * len(names)))
        ax.barh(names, [table[n]["tokens_per_s_per_gpu"]["median"] for n in names])
        ax.set_xlabel(f"tokens/s per GPU, {gpus} ranks (higher is better)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, stem(gpus, shape) + ".png"))
    return compared


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2, help="ranks (GPUs, or CPU ranks with --cpu)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="3b", choices=["tiny", "3b", "7b"])
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"among {VARIANTS + EXTRA}")
    ap.add_argument("--cpu", action="store_true", help="gloo ranks on the CPU (a smoke run)")
    ap.add_argument("--timeout", type=int, default=540, help="seconds a launch may take")
    ap.add_argument("--append", action="store_true",
                    help="add these rounds to those in --out's file for --gpus and --shape")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--profile", action="store_true",
                    help="one step more on each rank under torch.profiler, not timed")
    ap.add_argument("--rank-of", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_of:
        rank_main(args.rank_of, args.shape, args.result, args.profile)
        return
    if STEPS < 2:
        ap.error(f"FSDP_STEPS is the steps of a launch, at least 2 (the first is not timed); "
                 f"got {STEPS}")
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS + EXTRA]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {VARIANTS + EXTRA}")
    folder = os.path.join(args.out, "fsdp_offload_runs")
    os.makedirs(folder, exist_ok=True)
    rates, runs = [], {v: [] for v in variants}
    saved = os.path.join(args.out, stem(args.gpus, args.shape) + ".json")
    if args.append and os.path.exists(saved):      # the earlier rounds, paired as they ran
        with open(saved) as f:
            old = json.load(f)
        rates = old["rates"]    # (a variant this call does not run keeps its rounds)
        runs = {**old["runs"], **{v: old["runs"].get(v, [None] * len(rates)) for v in variants}}
    t0, before = time.time(), len(rates)
    for r in range(before, before + args.rounds):   # the order rotated a place each round
        print(f"round {r + 1}/{before + args.rounds}", flush=True)
        rates.append(None if args.cpu else {**method.pinned_rate(), **method.host_adamw_rate()})
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            runs[v].append(launch(v, args.gpus, args.shape, args.cpu, folder, args.timeout,
                                  args.profile))
        for v in set(runs) - set(variants):     # (not run this round: its place kept)
            runs[v].append(None)
        report(runs, rates, args.gpus, args.out, args.shape)   # (a run cut short keeps its rounds)
    print(f"{len(variants)} variants x {args.rounds} rounds in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
