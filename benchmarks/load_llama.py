"""From safetensors files to the first token (issue 35, points 1 and 5): a
Llama-architecture 7B saved as a Hugging Face model folder, loaded the ways
users load it, to generate under a 4 GiB budget: how long until the first
token, and what the host and the GPU hold on the way.

    python benchmarks/load_llama.py [--rounds 1] [--variants a,b] [--tiny] [--out DIR]

The model: offload_llama's 7B (13.48 GB of random bf16 weights), saved once
by save_pretrained in 5 GB shards to LOAD_LLAMA_DIR (default
/tmp/torch_uvm_llama7b; the first variant writes it if absent). Every load
then reads the files from the page cache (the host has room for them): a
warm read, the fastest a load can be.

Variants, each in a fresh process, interleaved round by round:
- checkpoint: writes the folder if it is not there (timed, not compared).
- pinned_rate: 1 GiB pinned copies, the link's rate for this round.
- resident: from_pretrained(..., device_map="cuda"): all on the GPU.
- hf_then_torch_uvm: from_pretrained to the CPU, then torch_uvm.offload
  (budget 4 GiB): the weights are in host memory before their homes.
- torch_uvm_checkpoint: the model made under accelerate's
  init_empty_weights, then torch_uvm.offload(..., checkpoint=folder): each
  tensor read from the files straight into its pinned home.
- torch_uvm_checkpoint_bound: the same with offload(..., gpu_memory=5 GiB,
  batch=1, seq=prompt and new tokens) instead of a budget (issue 55): the
  recipes' way (examples/recipes/); its whole process's peak is reported
  beside the bound and the budget chosen within it.
- accelerate: from_pretrained(..., device_map=...) with offload_llama's
  accelerate map for 4 GiB (embeddings, norm and head on the GPU, the
  decoder layers that fit beside them, the rest "cpu").

Each: the load (the call that makes the model, and the offload, timed
together), then a 1-token generate (batch 1, 32-token prompt): the load and
the first token are what a user waits for. Then one 16-token generate,
whose tokens are compared with resident's. Beside each: the host's peak
resident memory from after CUDA's start (VmHWM less VmRSS then: what
`top` shows, file pages mapped from the page cache included) and the
process's GPU memory (mem_get_info, sampled).

The link limit for the first token: all W bytes cross to the GPU at least
once before it, W / the round's pinned rate (0.25 s at 55 GB/s); reading
W from the page cache comes on top.

--tiny saves offload_llama's tiny Llama, for a smoke test in seconds.
Writes load_llama.json, load_llama.png and prints a table."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import method  # noqa: E402
from method import gib_cell  # noqa: E402
import offload_llama  # noqa: E402

GiB = 1 << 30
BUDGET_GIB = 4
BOUND_GIB = BUDGET_GIB + 1    # about what the budget's run took, CUDA's start included
VARIANTS = ["checkpoint", "pinned_rate", "resident", "hf_then_torch_uvm",
            "torch_uvm_checkpoint", "torch_uvm_checkpoint_bound", "accelerate"]
LOADS = VARIANTS[2:]


def folder(tiny: bool) -> str:
    return os.environ.get("LOAD_LLAMA_DIR", "/tmp/torch_uvm_llama7b") + ("_tiny" if tiny else "")


def status(field: str) -> int:
    """The kernel's count of this process's memory, bytes (/proc/self/status)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def write_checkpoint(tiny: bool) -> dict:
    path = folder(tiny)
    if os.path.isfile(os.path.join(path, "config.json")):
        return {"written": False, "path": path}
    t0 = time.perf_counter()
    model = offload_llama.build(tiny)
    built = time.perf_counter() - t0
    model.save_pretrained(path + ".part", max_shard_size="5GB", safe_serialization=True)
    os.rename(path + ".part", path)
    return {"written": True, "path": path, "build_s": built,
            "write_s": time.perf_counter() - t0 - built,
            "bytes": sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))}


def load(variant: str, path: str, budget: int):
    """The model, placed as `variant` places it; returns (model, offload
    handle or None, the seconds of each part: making the model, offload)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    parts, t0 = {}, time.perf_counter()
    if variant == "resident":
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16,
                                                    device_map="cuda"), None, parts
    if variant == "hf_then_torch_uvm":
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
        found = None
    else:
        from accelerate import init_empty_weights
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                                     torch_dtype=torch.bfloat16)
        found = path
    parts["model_s"] = time.perf_counter() - t0
    if variant == "accelerate":
        device_map, _, _ = offload_llama.accelerate_map(model, budget)
        del model
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16,
                                                    device_map=device_map), None, parts
    import torch_uvm
    t0 = time.perf_counter()
    if variant == "torch_uvm_checkpoint_bound":     # the whole process within the bound
        handle = torch_uvm.offload(model, gpu_memory=BOUND_GIB * GiB, device="cuda", mode="auto",
                                   checkpoint=found, batch=1,
                                   seq=offload_llama.PROMPT + offload_llama.NEW_TOKENS)
    else:
        handle = torch_uvm.offload(model, budget=budget, device="cuda", mode="auto",
                                   checkpoint=found)
    parts["offload_s"] = time.perf_counter() - t0
    return model, handle, parts


def host_rates(tiny: bool, total: int = 4 * GiB, piece: int = 256 << 20) -> dict:
    """What bounds a load into pinned homes, measured now (GB/s): pinning
    (homes of `piece` bytes made by torch_uvm, `total` in all, freed after)
    and reading the checkpoint's files from the page cache into pinned
    memory by the loader's own read (checkpoint._read), each on one thread
    and on READERS."""
    import concurrent.futures
    import torch
    import torch_uvm
    from torch_uvm import checkpoint
    like = torch.empty(piece, dtype=torch.uint8, device="meta")
    device = torch.device("cuda", torch.cuda.current_device())
    threads_tried = (1, checkpoint.READERS)
    out = {}
    for threads in threads_tried:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            homes = list(pool.map(lambda _: torch_uvm._C.empty_pinned_home(like, device),
                                  range(total // piece)))
            out[f"pin_gbps_{threads}"] = total / (time.perf_counter() - t0) / 1e9
        del homes
    if not os.path.isdir(folder(tiny)):
        return out
    entries = list(checkpoint.read_checkpoint(folder(tiny)).values())
    largest = max(e.end - e.begin for e in entries)
    buffers = [torch.empty(largest, dtype=torch.uint8, pin_memory=True)
               for _ in range(checkpoint.READERS)]
    for threads in threads_tried:
        def read(i):        # every threads-th entry, into this thread's own buffer
            files, nbytes = {}, 0
            for e in entries[i::threads]:
                f = files.get(e.path) or files.setdefault(e.path, open(e.path, "rb", buffering=0))
                into = buffers[i][:e.end - e.begin].view(e.dtype).view(e.shape)
                checkpoint._read(e, into, f)
                nbytes += e.end - e.begin
            for f in files.values():
                f.close()
            return nbytes
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            nbytes = sum(pool.map(read, range(threads)))
            out[f"read_gbps_{threads}"] = nbytes / (time.perf_counter() - t0) / 1e9
    return out


def run_variant(variant: str, tiny: bool) -> dict:
    if variant == "checkpoint":
        return write_checkpoint(tiny)
    if variant == "pinned_rate":
        return {**method.pinned_rate(), **host_rates(tiny)}
    import torch
    path = folder(tiny)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise RuntimeError(f"no checkpoint in {path}: run the checkpoint variant first "
                           "(--variants checkpoint,...)")
    budget = offload_llama.budget_bytes(BUDGET_GIB, tiny)
    # Imports are not the load's: made before it is timed. transformers
    # imports lazily, on a name's first use (7.7 s for these).
    import accelerate  # noqa: F401
    import torch_uvm  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401
    gpu = offload_llama.GpuMemory()
    at_start = torch.cuda.mem_get_info()[1] - gpu.base    # (CUDA's context: the bound counts it)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                        # VmHWM from here
    host_base = status("VmRSS")
    gpu.start("run")
    t0 = time.perf_counter()
    model, handle, parts = load(variant, path, budget)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    ids = torch.randint(0, model.config.vocab_size, (1, offload_llama.PROMPT),
                        generator=torch.Generator().manual_seed(offload_llama.PROMPT_SEED)).cuda()
    t0 = time.perf_counter()
    offload_llama.generate(model, ids, 1)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = offload_llama.generate(model, ids, offload_llama.NEW_TOKENS)
    torch.cuda.synchronize()
    out = {"load_s": load_s, "load_parts_s": parts, "first_token_s": first_s,
           "to_first_token_s": load_s + first_s,
           "tokens_per_s": offload_llama.NEW_TOKENS / (time.perf_counter() - t0),
           "tokens": tokens[0, offload_llama.PROMPT:].tolist(),
           "host_base_bytes": host_base, "host_peak_bytes": status("VmHWM") - host_base,
           "host_after_bytes": status("VmRSS") - host_base,
           "gpu_peak_bytes": gpu.peak("run"),
           "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "budget_bytes": budget}
    gpu.stop()
    if handle is not None:
        out["mode"] = handle.mode
    if variant == "torch_uvm_checkpoint_bound":
        out.update(bound_bytes=BOUND_GIB * GiB, budget_bytes=handle.state.bound.budget,
                   process_gpu_at_start_bytes=at_start, gpu_peak_run_bytes=out["gpu_peak_bytes"])
    return out


def report(runs: dict, out_dir: str, tiny: bool = False) -> dict:
    rates = [r["h2d_gbps"] if r else None for r in runs.get("pinned_rate", [])]
    resident = [r["to_first_token_s"] if r else None for r in runs.get("resident", [])]
    ref = next((r["tokens"] for r in runs.get("resident", []) if r), None)
    weights = next((r["weights_bytes"] for v in LOADS for r in runs.get(v, []) if r), None)
    limit = [weights / (g * 1e9) if g and weights else None for g in rates]
    print(f"\n## From safetensors to the first token, {'tiny' if tiny else '7B'} bf16, "
          f"{BUDGET_GIB} GiB budgets\n")
    print(f"Pinned H2D: {', '.join(f'{g:.1f}' for g in rates if g)} GB/s; the link limit "
          f"(W / rate): {', '.join(f'{x:.3f}' for x in limit if x)} s")
    for r in runs.get("pinned_rate", []):
        if r and "pin_gbps_1" in r:
            print(f"Host: pinning {r['pin_gbps_1']:.1f} GB/s on one thread, "
                  f"{r.get('pin_gbps_4', 0):.1f} on four; reading the files from the page cache "
                  f"{r.get('read_gbps_1', 0):.1f} GB/s on one thread, "
                  f"{r.get('read_gbps_4', 0):.1f} on four; "
                  f"W at the pinning rate: {weights / (r['pin_gbps_1'] * 1e9):.1f} s"
                  if weights else "")
    print()
    print("| variant | load, s | of which offload, s | first token, s | to first token, s | × resident's | host peak, GiB "
          "| host after, GiB | process GPU memory, GiB | tokens = resident's |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    compared, tables = {}, {}
    for v in LOADS:
        ok = [r for r in runs.get(v, []) if r]
        if not ok:
            print(f"| {v} | failed | | | | | | | | |")
            continue
        row = {k: method.summarize([r[k] for r in ok]) for k in
               ("load_s", "first_token_s", "to_first_token_s")}
        row["offload_s"] = method.summarize([r["load_parts_s"]["offload_s"] for r in ok
                                             if "offload_s" in r.get("load_parts_s", {})])
        row.update({k: max(r[k] for r in ok) for k in
                    ("host_peak_bytes", "host_after_bytes", "gpu_peak_bytes")})
        row["same_tokens"] = all(r["tokens"] == ref for r in ok) if ref else None
        tables[v] = row
        x = method.ratio([r["to_first_token_s"] if r else None for r in runs[v]], resident)
        if x and v != "resident":
            compared[f"{v}: time to the first token / resident's"] = x
        print(f"| {v} | {row['load_s']['median']:.1f} | {method.median_cell(row['offload_s'], '.1f')} | "
              f"{row['first_token_s']['median']:.2f} | "
              f"{row['to_first_token_s']['median']:.1f} | "
              f"{'—' if not x or v == 'resident' else format(x['median'], '.2f')} | "
              f"{gib_cell(row['host_peak_bytes'])} | {gib_cell(row['host_after_bytes'])} | "
              f"{gib_cell(row['gpu_peak_bytes'])} | {row['same_tokens']} |")
        if ok[0].get("bound_bytes"):      # the whole process against its bound
            row.update({k: ok[0][k] for k in ("bound_bytes", "budget_bytes",
                                               "process_gpu_at_start_bytes")})
            row["gpu_peak_run_bytes"] = row["gpu_peak_bytes"]
            method.report_bound(row, ok)
    for anchor in ("hf_then_torch_uvm", "accelerate"):
        mine = [r["to_first_token_s"] if r else None for r in runs.get("torch_uvm_checkpoint", [])]
        theirs = [r["to_first_token_s"] if r else None for r in runs.get(anchor, [])]
        compared[f"torch_uvm_checkpoint: time to the first token / {anchor}'s"] = \
            method.ratio(mine, theirs)
    method.print_comparisons(compared)
    os.makedirs(out_dir, exist_ok=True)
    stem = "load_llama" + ("_tiny" if tiny else "")
    method.write(os.path.join(out_dir, stem + ".json"), compared, runs=runs, tables=tables,
                 tiny=tiny, budget_gib=BUDGET_GIB, link_limit_s=limit)
    plot(tables, os.path.join(out_dir, stem + ".png"))
    return compared


def plot(tables: dict, path: str) -> None:
    """Time to the first token against the host's peak memory, a point per
    variant, the GPU memory in its label."""
    plt = method.pyplot()
    if plt is None or not tables:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v, row in tables.items():
        t = row["to_first_token_s"]
        ax.errorbar([row["host_peak_bytes"] / GiB], [t["median"]],
                    yerr=[[t["median"] - t["min"]], [t["max"] - t["median"]]], marker="o",
                    capsize=3, label=f"{v} (GPU {row['gpu_peak_bytes'] / GiB:.1f} GiB)")
    ax.set_xlabel("host peak resident memory, GiB (VmHWM)")
    ax.set_ylabel("load + first token, s")
    ax.legend(fontsize=7)
    ax.set_title("From safetensors files to the first token")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    method.process_driver(__file__, __doc__.splitlines()[0], VARIANTS, [], run_variant, report,
                          rounds=1, only="", timeout=600)
