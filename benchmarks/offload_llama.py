"""Larger than the GPU, the workload users come for (issue 35, point 1, first
bullet): generation with a Llama-architecture 7B model under budgets of 4 and
8 GiB, beside all-resident and accelerate's dispatch_model given the same GPU
memory, against the link's limit measured in the same round.

    python benchmarks/offload_llama.py [--rounds 2] [--variants a,b] [--tiny] [--out DIR]

The model: HF LlamaConfig with 32 layers, hidden 4096, intermediate 11008,
32 heads, vocabulary 32000; random bf16 weights (6.74 G parameters, 13.48 GB),
no download. It is built on the meta device, given CPU storage by to_empty and
filled in place (seeded, in a fixed order: the same weights in every process),
so the host never holds a second full copy; the rotary embedding's inv_freq,
a non-persistent buffer that to_empty leaves as garbage, is made again.

Workloads: batch 1 and batch 8, a 32-token random prompt, 16 new tokens,
greedy. In each process: the placement (model.cuda(), torch_uvm.offload or
accelerate's dispatch_model), timed; a 1-new-token generate right after it
(the first token's time: with the placement, what a user waits for); one
warm-up generate of 4 new tokens (prefill and decode both run, and offload has
learnt its order and made its plan); then the timed generates of 16 tokens
(two, or one where one takes over 10 s), the fastest counting.

Variants, each in a fresh process, interleaved round by round:
- pinned_rate: 1 GiB pinned copies, the link's rate for this round.
- resident: the whole model on the GPU; batch 1 then 8 in one process (its
  batch 8 first token is not right after the placement).
- torch_uvm_<B>GiB_b<n>: torch_uvm.offload(model, budget=B, mode="auto"), one
  process per budget and batch: "auto" chooses in place or prefetch for good
  at the first forward, from its rows (batch 1's 32-token prefill may read in
  place, batch 8's 256 rows prefetch), so a batch must meet a fresh offload;
  a process is cheaper than undo() and a second offload, and keeps one model
  and its homes alive at a time.
- torch_uvm_bound_<G>GiB_b<n>: torch_uvm.offload(model, gpu_memory=G,
  batch=n, seq=prompt + new tokens, mode="auto"): the whole process held to
  G GiB, the budget chosen within it (issue 55), G the 4 GiB budget's
  process memory rounded up (5 GiB). Its report sets the process's whole
  peak (what it held at CUDA's start plus the run's peak) beside G and the
  budget chosen; its link limit is the chosen budget's.
- accelerate_<B>GiB: accelerate.dispatch_model with a device_map putting the
  embeddings, the final norm, the rotary embedding and lm_head on the GPU and
  as many decoder layers as fit B beside them; the rest "cpu" (accelerate's
  documented CPU offload: hooks copy each offloaded layer to the GPU before
  its forward; offload_buffers=False, its default, keeps buffers on the GPU).
  That is at least as many layers as accelerate's own infer_auto_device_map
  gives with max_memory={0: B} (recorded), which keeps room for one layer.
  Batch 1 then 8 in one process.
- accelerate_pinned_<B>GiB (only when named by --variants): the same with the
  offloaded layers' weights handed to dispatch_model as pinned host tensors
  (its state_dict argument): not a documented form, a stronger anchor.
- resident_sweep and torch_uvm_4GiB_sweep (only when named): throughput
  generation, the memory the budget frees spent on batch size (FlexGen's
  lesson): batches 32, 128, 512 and 1024 in one process ("auto" meets batch
  32's 1024-row prefill first, so it prefetches), beside the link limit x
  batch and all resident's tokens/s at the same batch (the compute limit).
  Their processes run PyTorch's allocator with expandable segments: the KV
  cache, grown a token at a time, otherwise strands fixed segments.
  The plot gains a panel of tokens/s against batch.

The link limit: a budget of B bytes holds at most B bytes of the W bytes of
weights, so at least W - B cross the link per token whatever the placement:
tokens/s <= batch x pinned H2D rate / (W - B), the rate from the same round's
pinned_rate. Targets: torch_uvm >= 0.85 of it, and above accelerate at the
same budget and batch.

Beside every figure: the process's GPU memory apart from any allocator's
books (a thread samples torch.cuda.mem_get_info every 2 ms; the peak of the
free bytes after CUDA's start and a warm-up kernel less the free bytes, over
the timed generates and over the whole run from the placement on) and the
peak host memory (ru_maxrss). Greedy tokens are compared with all-resident's.

Duration, 2 rounds on an H100 (estimated, not yet measured): a process builds
the model in ~10 s (imports, CUDA's start, 13.5 GB drawn on the GPU and copied
into CPU storage) and offload() pins 13.5 GB of homes in ~5-10 s; the link
limit is ~5.8 tokens/s at 4 GiB and ~11 at 8 GiB (batch 1, ~53 GB/s);
accelerate's pageable per-layer copies (~7 GB/s measured on smaller models)
make it ~1.3 s a token at 4 GiB, the longest variant (~70 s a round). About
4 minutes a round, 8 in all. --variants trims it.

--tiny builds a 2-layer Llama of hidden 256 (vocabulary 512) with budgets of
the same share of its weights, for a smoke test of the whole script in
seconds; its results go to offload_llama_tiny.json / .png.
Writes offload_llama.json and offload_llama.png to --out.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torch_uvm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # method
import method  # noqa: E402
from method import gib_cell, median_cell  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
PROMPT, NEW_TOKENS, WARM_TOKENS = 32, 16, 4
BATCHES = (1, 8)
BUDGETS_GIB = (4, 8)
# Throughput generation (opt-in): the memory a budget frees spent on batch
# size, FlexGen's lesson. Every weight crosses once per token step whatever
# the batch, so the link limit grows with the batch until compute binds.
SWEEP, SWEEP_GIB = (32, 128, 512, 1024), 4
CARD_GIB = 24                     # a 24 GB card, as the recipes' (examples/recipes/)
TIMED, TIMED_S = 2, 10.0          # timed generates: two, or one that takes longer than TIMED_S
SEED, PROMPT_SEED = 0, 1


def variants():
    """(default variants in their order within a round, opt-in variants)."""
    default, extra = ["pinned_rate", "resident"], []
    for g in BUDGETS_GIB:
        default += [f"torch_uvm_{g}GiB_b{b}" for b in BATCHES] + [f"accelerate_{g}GiB"]
        extra.append(f"accelerate_pinned_{g}GiB")
    # under gpu_memory, a bound on the whole process: the budget's run's
    # process memory, about the budget and a GiB (issue 55)
    default += [f"torch_uvm_bound_{g + 1}GiB_b{b}" for g in BUDGETS_GIB[:1] for b in BATCHES]
    extra += ["resident_sweep", f"torch_uvm_{SWEEP_GIB}GiB_sweep"]
    # a card of CARD_GIB (issue 56's recipes): the whole process within it,
    # beside accelerate given as much (where the 7B fits whole, both hold it all)
    extra += [f"torch_uvm_bound_{CARD_GIB}GiB_b{b}" for b in BATCHES] + [f"accelerate_{CARD_GIB}GiB"]
    return default, extra


def parse(variant: str):
    """(kind, budget in GiB or None, batches) of a variant's name."""
    if variant in ("resident", "resident_sweep"):
        return "resident", None, SWEEP if variant.endswith("_sweep") else BATCHES
    gib, rest = method.variant_gib(variant), variant.rsplit("_", 1)[1]
    if variant.startswith("torch_uvm_bound_"):            # torch_uvm_bound_5GiB_b1: gpu_memory
        return "torch_uvm_bound", gib, (int(rest[1:]),)
    if variant.startswith("torch_uvm_"):                  # torch_uvm_4GiB_b1, torch_uvm_4GiB_sweep
        return "torch_uvm", gib, SWEEP if rest == "sweep" else (int(rest[1:]),)
    return variant.rsplit("_", 1)[0], gib, BATCHES       # accelerate(_pinned)_4GiB


# ---------------------------------------------------------------- the model

# Llama shapes (HF LlamaConfig fields): the 7B of this script; a 3B of
# Llama-3.2-3B's shapes (28 layers, hidden 3072, grouped-query attention with
# 8 key-value heads) with Llama-2's 32000-token vocabulary, for full
# fine-tuning (offload_train's llama); and a tiny one for smoke tests.
SHAPES = {
    "7b": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008,
               num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
               max_position_embeddings=2048),
    "3b": dict(num_hidden_layers=28, hidden_size=3072, intermediate_size=8192,
               num_attention_heads=24, num_key_value_heads=8, vocab_size=32000,
               max_position_embeddings=2048),
    "tiny": dict(num_hidden_layers=2, hidden_size=256, intermediate_size=688,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=512,
                 max_position_embeddings=256),
}


def llama_config(tiny: bool = False, shape: str = "7b", **extra):
    from transformers import LlamaConfig
    return LlamaConfig(tie_word_embeddings=False, attention_bias=False,
                       **{**SHAPES["tiny" if tiny else shape], **extra})


def weights_bytes(config, element_size: int = 2) -> int:
    """The bytes of a Llama's parameters (no biases, untied head)."""
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return element_size * (2 * config.vocab_size * h + config.num_hidden_layers * per_layer + h)


def budget_bytes(gib: float, tiny: bool = False) -> int:
    """A budget of `gib` GiB; for --tiny, the same share of its weights."""
    if not tiny:
        return int(gib * GiB)
    return int(gib * GiB * weights_bytes(llama_config(True)) / weights_bytes(llama_config(False)))


def _fresh_rotary(old, config):
    """A new rotary embedding module of `old`'s class, computed on the CPU.
    transformers >= 4.45 takes the config (5.x only the config); before,
    each attention layer had one built from the head's dimension."""
    cls = type(old)
    try:
        return cls(config=config)
    except TypeError:
        return cls(config.hidden_size // config.num_attention_heads,
                   max_position_embeddings=config.max_position_embeddings,
                   base=getattr(config, "rope_theta", 10000.0))


def fix_non_persistent(model, config) -> None:
    """to_empty leaves non-persistent buffers (not in a state dict, so no
    checkpoint would fill them either) as uninitialized memory: the rotary
    embeddings' inv_freq. Replaces every rotary embedding module by a fresh
    one, and refuses a model with other such buffers."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding"):
                setattr(parent, name, _fresh_rotary(child, config))
    left = [f"{n}.{b}" for n, m in model.named_modules() for b in m._non_persistent_buffers_set
            if not type(m).__name__.endswith("RotaryEmbedding")]
    if left:
        raise RuntimeError(f"non-persistent buffers this builder does not know how to make: {left}")


def fill_weights(model, device: str, ones=lambda name: "norm" in name) -> None:
    """Every parameter in place, in named_parameters() order from one seeded
    generator on `device` (the same weights in every process on one machine):
    norm weights (the vectors whose names `ones` picks) ones, other vectors
    (biases) zeros, matrices N(0, 0.02). On a GPU, each tensor is drawn
    there and copied into its CPU storage."""
    import torch
    gen = torch.Generator(device=device).manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0) if ones(name) else p.zero_()
            elif p.device.type == torch.device(device).type:
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.copy_(torch.empty(p.shape, dtype=p.dtype, device=device)
                        .normal_(0.0, 0.02, generator=gen))
    if device != "cpu":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def build(tiny: bool = False, fill: str = None, shape: str = "7b", dtype=None, **config):
    """The Llama (bf16 unless `dtype`) on the CPU, without a second full host
    copy: made on the meta device, given storage by to_empty, filled in place.
    `fill`: where the random numbers are drawn (default the GPU if there is
    one: faster). `config`: more LlamaConfig fields (attn_implementation)."""
    import torch
    from transformers import LlamaForCausalLM
    config = llama_config(tiny, shape, **config)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype or torch.bfloat16).to_empty(device="cpu")
    fix_non_persistent(model, config)      # inv_freq in float32, as from_pretrained leaves it
    fill_weights(model, fill or ("cuda" if torch.cuda.is_available() else "cpu"))
    return model.eval()


def accelerate_map(model, budget: int):
    """accelerate's device_map for `budget` bytes of GPU memory: everything
    but the decoder layers on GPU 0, and the first layers that fit beside
    them; the rest "cpu". Returns (device_map, layers on the GPU, GPU bytes)."""
    layers = model.model.layers
    per_layer = sum(p.numel() * p.element_size() for p in layers[0].parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rest = weights - per_layer * len(layers)
    on_gpu = max(0, min(len(layers), (budget - rest) // per_layer))
    device_map = {}
    for name, child in model.named_children():
        if name != "model":
            device_map[name] = 0
            continue
        for sub, _ in child.named_children():
            if sub == "layers":
                device_map.update({f"model.layers.{i}": 0 if i < on_gpu else "cpu"
                                   for i in range(len(layers))})
            else:
                device_map[f"model.{sub}"] = 0
    return device_map, int(on_gpu), int(rest + on_gpu * per_layer)


def auto_map(model, budget: int) -> dict:
    """accelerate's own infer_auto_device_map given max_memory={0: budget}
    (for the record: it keeps room on the GPU for the largest layer, and
    fills it in module order)."""
    from accelerate import infer_auto_device_map
    return {k: str(v) for k, v in infer_auto_device_map(
        model, max_memory={0: budget, "cpu": 1 << 42}, clean_result=False,
        no_split_module_classes=["LlamaDecoderLayer"]).items()}


def layers_on_gpu(device_map: dict, layers: int) -> int:
    """How many decoder layers a device_map puts on GPU 0."""
    if str(device_map.get("", device_map.get("model", device_map.get("model.layers")))) == "0":
        return layers
    return sum(1 for i in range(layers) if str(device_map.get(f"model.layers.{i}")) == "0")


# ------------------------------------------------------------ measurements

class GpuMemory:
    """The process's GPU memory, apart from any allocator's books: the
    device's free bytes after CUDA's start and a warm-up kernel, less its free
    bytes now, sampled by a thread every `period` s; `start(key)` opens a
    window, `peak(key)` is the most seen in it so far."""

    def __init__(self, period: float = 0.002):
        import torch
        self._free = lambda: torch.cuda.mem_get_info()[0]
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        self.base, self.period, self._peaks = self._free(), period, {}
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> int:
        used = self.base - self._free()
        with self._lock:
            for k, v in self._peaks.items():
                self._peaks[k] = max(v, used)
        return used

    def _loop(self):
        while not self._stop.wait(self.period):
            self._sample()

    def start(self, key: str) -> None:
        with self._lock:
            self._peaks[key] = 0
        self._sample()

    def peak(self, key: str) -> int:
        self._sample()
        with self._lock:
            return self._peaks[key]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def generate(model, ids, new_tokens: int, scores: bool = False):
    """Greedy; with `scores`, generate's dict output with each step's scores."""
    import torch
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0, return_dict_in_generate=scores,
                              output_scores=scores)


def digest(t) -> str:
    """A tensor's exact bytes, hashed: equal only if bit for bit equal."""
    import hashlib
    return hashlib.sha1(t.float().cpu().contiguous().numpy().tobytes()).hexdigest()


def run_variant(variant: str, tiny: bool) -> dict:
    if variant == "pinned_rate":
        return method.pinned_rate()
    if variant.endswith("_sweep"):
        # the KV cache grows by a concatenation a token, a new block of a new
        # size every step; in fixed segments PyTorch's allocator strands them
        # (at batch 1024, 78 GiB reserved for 44 GiB allocated): expandable
        # segments, before CUDA starts, as PyTorch's docs advise for this
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch
    kind, gib, batches = parse(variant)
    if kind.startswith("torch_uvm"):
        import torch_uvm
    gpu = GpuMemory()
    t0 = time.perf_counter()
    model = build(tiny)
    out = {"build_s": time.perf_counter() - t0,
           "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
           "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "budget_bytes": budget_bytes(gib, tiny) if gib and kind != "torch_uvm_bound" else None,
           "batches": {}}
    if kind == "torch_uvm_bound":      # (the bound counts the whole process: not scaled for --tiny)
        out["bound_bytes"] = int(gib * GiB)
        out["process_gpu_at_start_bytes"] = torch.cuda.mem_get_info()[1] - gpu.base
    budget = out["budget_bytes"]
    if kind.startswith("accelerate"):
        from accelerate import dispatch_model
        out["auto_map"] = auto_map(model, budget)
        out["auto_map_layers_on_gpu"] = layers_on_gpu(out["auto_map"], len(model.model.layers))
        device_map, on_gpu, gpu_bytes = accelerate_map(model, budget)
        out.update(layers_on_gpu=on_gpu, weights_on_gpu_bytes=gpu_bytes)
    gpu.start("run")
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if kind == "resident":
        model.cuda()
    elif kind == "torch_uvm":
        handle = torch_uvm.offload(model, budget=budget, device="cuda", mode="auto")
    elif kind == "torch_uvm_bound":    # the budget chosen within the bound, for the longest batch
        torch.cuda.empty_cache()       # (what building the model left cached is not the process's)
        handle = torch_uvm.offload(model, gpu_memory=out["bound_bytes"], device="cuda",
                                   mode="auto", batch=max(batches), seq=PROMPT + NEW_TOKENS)
        out["budget_bytes"] = handle.state.bound.budget
    else:
        state_dict = None
        if kind == "accelerate_pinned":
            cpu = tuple(f"{m}." for m, d in device_map.items() if d == "cpu")
            state_dict = {k: v.pin_memory() for k, v in model.state_dict().items()
                          if k.startswith(cpu)}
        dispatch_model(model, device_map=device_map, main_device=0, state_dict=state_dict)
        del state_dict
    torch.cuda.synchronize()
    out["place_s"] = time.perf_counter() - t0
    vocab = model.config.vocab_size
    for i, b in enumerate(batches):
        ids = torch.randint(0, vocab, (b, PROMPT),
                            generator=torch.Generator().manual_seed(PROMPT_SEED)).cuda()
        t0 = time.perf_counter()
        one = generate(model, ids, 1, scores=True)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        generate(model, ids, WARM_TOKENS)
        torch.cuda.synchronize()
        gpu.start("timed")
        times = []
        while len(times) < TIMED and sum(times) < TIMED_S:
            t0 = time.perf_counter()
            tokens = generate(model, ids, NEW_TOKENS)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out["batches"][str(b)] = {
            "tokens_per_s": b * NEW_TOKENS / min(times), "times_s": times,
            "first_token_s": first, "first_after_placement": i == 0,
            "first_scores_sha1": digest(one.scores[0]),
            "gpu_peak_timed_bytes": gpu.peak("timed"),
            "tokens": tokens[:, PROMPT:].tolist()}
    out.update(gpu_peak_run_bytes=gpu.peak("run"),
               torch_reserved_peak_bytes=torch.cuda.max_memory_reserved(),
               torch_allocated_peak_bytes=torch.cuda.max_memory_allocated())
    gpu.stop()
    if kind.startswith("torch_uvm"):
        stats = torch_uvm.memory_stats()
        out.update(mode=handle.mode, resident_units=len(handle.resident_units()),
                   units=len(handle.units),
                   resident_bytes_peak=handle.residency_stats()["resident_bytes.peak"],
                   slot_reserved_peak_bytes=stats.get("slots.cuda:0.reserved_bytes.peak"))
    out["host_peak_bytes"] = method.host_peak_bytes()
    return out


# ---------------------------------------------------------------- the report

def series(runs: dict) -> dict:
    """{label: {batch: [round r's figures (the process's merged with the
    batch's) or None]}}, label "resident", "torch_uvm 4GiB", "accelerate 4GiB"."""
    rounds = max((len(rs) for rs in runs.values()), default=0)
    out = {}
    for v, rs in runs.items():
        if v == "pinned_rate":
            continue
        kind, gib, batches = parse(v)
        label = kind if gib is None else f"{kind} {gib}GiB"
        for b in batches:
            out.setdefault(label, {})[b] = [
                None if r is None or str(b) not in r["batches"] else
                {**{k: x for k, x in r.items() if k != "batches"}, **r["batches"][str(b)]}
                for r in list(rs) + [None] * (rounds - len(rs))]
    return out


def report(runs: dict, out_dir: str, tiny: bool = False) -> dict:
    """Prints the table and the ratios, writes the JSON and the plot; returns
    the comparisons."""
    rates = [r["h2d_gbps"] if r else None for r in runs.get("pinned_rate", [])]
    s = series(runs)
    ref = {b: next((x for x in xs if x), None) for b, xs in s.get("resident", {}).items()}
    rate = method.summarize([r for r in rates if r])
    weights = next((x["weights_bytes"] for xs in s.values() for b in xs for x in xs[b] if x), None)
    print(f"\nLlama-architecture {'tiny (2 layers, hidden 256)' if tiny else '7B'}, "
          f"{gib_cell(weights)} GiB of bf16 weights, {NEW_TOKENS} new tokens greedy from a "
          f"{PROMPT}-token prompt; pinned H2D rate: {median_cell(rate, '.1f')} GB/s")
    print("| variant | batch | tokens/s (median, min–max) | link limit, tokens/s | of the limit "
          "| torch_uvm / accelerate | process GPU, GiB: timed (whole run) | torch allocator "
          "reserved peak, GiB | host peak, GiB | placing, s | first token, s | tokens (first "
          "scores) = resident |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    tables, compared = {}, {}
    for label, per_batch in s.items():
        for b, xs in sorted(per_batch.items()):
            ok = [x for x in xs if x]
            key = f"{label}, batch {b}"
            if not ok:
                print(f"| {label} | {b} | failed | | | | | | | | | |")
                continue
            tps = [x["tokens_per_s"] if x else None for x in xs]
            budget = ok[0]["budget_bytes"]
            # the least any placement must bring per token: all but the budget's bytes
            least = None if budget is None else max(0, ok[0]["weights_bytes"] - budget)
            limits = [b * rt * 1e9 / least if least and rt else None
                      for rt in rates + [None] * (len(xs) - len(rates))]
            of_limit = method.ratio(tps, limits, target=0.85 if label.startswith("torch_uvm")
                                    else None, lower_is_better=False) if least else None
            vs = None
            if label.startswith("torch_uvm"):
                acc = s.get(label.replace("torch_uvm", "accelerate"), {}).get(b)
                if acc:
                    vs = method.ratio(tps, [x["tokens_per_s"] if x else None for x in acc],
                                      target=1.0, lower_is_better=False)
            res = s.get("resident", {}).get(b)
            vs_res = method.ratio(tps, [x["tokens_per_s"] if x else None for x in res],
                                  lower_is_better=False) if res and label != "resident" else None
            # greedy tokens, and the first token's scores bit for bit, against all-resident's
            same = None if ref.get(b) is None else all(x["tokens"] == ref[b]["tokens"] for x in ok)
            same_scores = None if ref.get(b) is None else all(
                x["first_scores_sha1"] == ref[b]["first_scores_sha1"] for x in ok)
            row = {"tokens_per_s": method.summarize([t for t in tps if t]),
                   "link_limit_tokens_per_s": method.summarize([x for x in limits if x]),
                   "of_limit": of_limit, "vs_accelerate": vs, "vs_resident": vs_res,
                   "least_bytes_per_token": least, "same_tokens": same,
                   "same_first_scores": same_scores,
                   "first_token_s": method.summarize([x["first_token_s"] for x in ok]),
                   "first_after_placement": ok[0]["first_after_placement"],
                   "place_s": method.summarize([x["place_s"] for x in ok]),
                   "build_s": method.summarize([x["build_s"] for x in ok]),
                   **{k: max(x[k] for x in ok) for k in
                      ("gpu_peak_timed_bytes", "gpu_peak_run_bytes", "torch_reserved_peak_bytes",
                       "host_peak_bytes")},
                   **{k: ok[-1][k] for k in ("budget_bytes", "bound_bytes",
                                             "process_gpu_at_start_bytes", "weights_bytes", "mode",
                                             "resident_units", "units", "resident_bytes_peak",
                                             "slot_reserved_peak_bytes", "layers_on_gpu",
                                             "auto_map_layers_on_gpu", "weights_on_gpu_bytes")
                      if k in ok[-1]}}
            tables[key] = row
            t, lim = row["tokens_per_s"], row["link_limit_tokens_per_s"]
            print(f"| {label}{' (' + ok[-1]['mode'] + ')' if 'mode' in ok[-1] else ''} | {b} | "
                  f"{t['median']:.2f} ({t['min']:.2f}–{t['max']:.2f}) | "
                  f"{median_cell(lim)} | {median_cell(of_limit)} | {median_cell(vs)} | "
                  f"{gib_cell(row['gpu_peak_timed_bytes'])} "
                  f"({gib_cell(row['gpu_peak_run_bytes'])}) | "
                  f"{gib_cell(row['torch_reserved_peak_bytes'])} | "
                  f"{gib_cell(row['host_peak_bytes'])} | "
                  f"{row['place_s']['median']:.1f} | {row['first_token_s']['median']:.2f}"
                  f"{'' if row['first_after_placement'] else ' (warm)'} | {same} ({same_scores}) |")
            if row.get("bound_bytes"):    # the whole process against its bound
                method.report_bound(row, ok)
            if of_limit and label != "resident":
                compared[f"{key}, tokens/s / link limit ({least / MiB:.0f} MiB a token at the "
                         f"pinned rate)"] = of_limit
            if vs:
                compared[f"{key}, torch_uvm / accelerate, tokens/s"] = vs
            if vs_res and label.startswith("torch_uvm"):
                compared[f"{key}, tokens/s / all resident's"] = vs_res
    method.print_comparisons(compared)
    os.makedirs(out_dir, exist_ok=True)
    stem = "offload_llama_tiny" if tiny else "offload_llama"
    method.write(os.path.join(out_dir, stem + ".json"), compared, runs=runs, tables=tables,
                 tiny=tiny, prompt=PROMPT, new_tokens=NEW_TOKENS, batches=list(BATCHES),
                 sweep=list(SWEEP))
    plot(tables, os.path.join(out_dir, stem + ".png"), tiny)
    return compared


def plot(tables: dict, path: str, tiny: bool) -> None:
    """Tokens/s per variant, one panel per batch (log scale), each bar
    labelled with the process's GPU memory; the link limit of each budget as
    a dashed line over that budget's bars."""
    plt = method.pyplot()
    if plt is None:
        return
    swept = any(k.endswith(f", batch {b}") for k in tables for b in SWEEP)
    panels = len(BATCHES) + swept
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    if swept:
        plot_sweep(axes[-1], tables)
    for ax, b in zip(axes, BATCHES):
        keys = [k for k in tables if k.endswith(f", batch {b}")]
        if not keys:
            continue
        names = [k[:-len(f", batch {b}")] for k in keys]
        med, err = method.error_bars([tables[k]["tokens_per_s"] for k in keys])
        colors = ["tab:gray" if n == "resident" else "tab:blue" if n.startswith("torch_uvm")
                  else "tab:orange" for n in names]
        ax.bar(range(len(keys)), med, yerr=err, capsize=4, color=colors)
        for x, k in enumerate(keys):
            ax.annotate(f"{tables[k]['gpu_peak_timed_bytes'] / GiB:.1f} GiB", (x, med[x]),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 3),
                        textcoords="offset points")
        for gib in BUDGETS_GIB:
            xs = [x for x, n in enumerate(names) if n.endswith(f" {gib}GiB")]
            lims = [tables[keys[x]]["link_limit_tokens_per_s"] for x in xs]
            if xs and lims[0]:
                ax.hlines(lims[0]["median"], min(xs) - 0.4, max(xs) + 0.4, colors="k",
                          linestyles="--")
                ax.annotate(f"link limit, {gib} GiB", (max(xs) + 0.4, lims[0]["median"]),
                            fontsize=7, ha="right", va="bottom")
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(names, rotation=20, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"batch {b}")
    fig.suptitle(f"Llama {'tiny' if tiny else '7B'} generation, {NEW_TOKENS} tokens greedy "
                 "(labels: process GPU memory, timed runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_sweep(ax, tables: dict) -> None:
    """Tokens/s against batch size (log-log) for each variant measured at
    more than one batch, labelled with the process's GPU memory at its
    largest batch; the link limit of the swept budget, which grows with the
    batch, dashed."""
    curves = {}
    for key, row in tables.items():
        label, b = key.rsplit(", batch ", 1)
        curves.setdefault(label, []).append((int(b), row))
    for label, points in sorted(curves.items()):
        if len(points) < 2:
            continue
        points.sort()
        xs = [b for b, _ in points]
        ax.plot(xs, [r["tokens_per_s"]["median"] for _, r in points], marker="o", label=label)
        b, last = points[-1]
        ax.annotate(f"{last['gpu_peak_timed_bytes'] / GiB:.1f} GiB",
                    (b, last["tokens_per_s"]["median"]), fontsize=7, xytext=(3, 0),
                    textcoords="offset points")
        if label == f"torch_uvm {SWEEP_GIB}GiB":
            lims = [(b, r["link_limit_tokens_per_s"]) for b, r in points]
            ax.plot([b for b, lim in lims if lim], [lim["median"] for b, lim in lims if lim],
                    "k--", label=f"link limit, {SWEEP_GIB} GiB (x batch)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput against batch (labels: process GPU memory)")
    ax.legend(fontsize=7)


def main(argv=None):
    default, extra = variants()
    method.process_driver(
        __file__, "Llama 7B generation: torch_uvm.offload at 4 and 8 GiB beside all-resident "
        "and accelerate, against the link's limit. Variants: " + ", ".join(default)
        + "; opt-in: " + ", ".join(extra), default, extra, run_variant, report, rounds=2,
        only="generate", timeout=300, argv=argv)


if __name__ == "__main__":
    main()
