"""torch_uvm.estimate and `python -m torch_uvm estimate`: each part by hand
on a small config, the refusals, the command without a GPU, and the
targets against every committed run (benchmarks/estimate_check.py): GPU
and host memory within 10% of the measured, the time floor never above it."""
import json
import os
import subprocess
import sys

import pytest
import torch

from torch_uvm.estimate import (FORWARD_RUNTIME_BYTES, RUNTIME_BYTES, CACHE_SHARE, estimate,
                                least_full_crossing)
from torch_uvm.offload_state import TRAINING_EXTRA, TRAINING_HOMES, window_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

TINY = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688,
        "vocab_size": 512, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def test_each_part_of_a_generation_by_hand():
    e = estimate(TINY, task="generate", budget=1 << 20, batch=3, seq=10, new_tokens=6,
                 link_gbps=50.0)
    h, kv = 256, 2 * 64
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * 688 + 2 * h
    weights = 2 * (2 * 512 * h + h + 2 * per_layer)
    assert e.weights == weights
    assert e.gpu["slots"] == 1 << 20
    assert e.gpu["KV cache"] == 2 * 2 * 3 * (10 + 6) * kv * 2
    assert e.gpu["logits"] == 3 * 512 * (2 + 4)
    assert e.gpu["activations"] == int(3 * 10 * h * 34)        # Korthikanti's, bf16
    assert e.gpu["allocator's cache"] == int(CACHE_SHARE * (e.gpu["activations"] + e.gpu["logits"]))
    assert e.gpu["workspaces"] == FORWARD_RUNTIME_BYTES          # (a forward alone)
    assert e.gpu_total == sum(e.gpu.values())
    assert e.host_pinned == weights
    # every weight outside the budget crosses once a token
    assert e.floor_s == pytest.approx((weights - (1 << 20)) / 50e9)
    # the largest unit: an MLP projection (256 x 688), larger than the embedding (512 x 256)
    assert e.least_budget == window_bytes("prefetch", False, 1, 2 * h * 688)


def test_training_keeps_each_layers_input_and_one_layers_work_with_checkpointing(monkeypatch):
    # (without checkpointing, the formula stands where transformers cannot make the model)
    from torch_uvm.estimate_trace import TraceFailed

    def absent(config):
        raise TraceFailed("transformers is not installed")
    monkeypatch.setattr(sys.modules["torch_uvm.estimate"], "decoder_of", absent)
    full = estimate(TINY, task="full", budget=1 << 22, batch=2, seq=8, link_gbps=None)
    with pytest.warns(UserWarning, match=r"\(transformers is not installed\): its "
                                         r"activations are a standard layer's by formula"):
        plain = estimate(TINY, task="full", budget=1 << 22, batch=2, seq=8,
                         checkpointing=False, link_gbps=None)
    layer = 2 * 8 * 256 * 34 * 2 / 2                       # bf16 autocast
    assert full.gpu["activations"] == int(2 * 2 * 8 * 256 * 4 + layer)   # fp32 inputs kept
    assert plain.gpu["activations"] == int(2 * layer)
    assert full.gpu["logits"] == 2 * 8 * 512 * (2 + 4 + 4)
    assert full.gpu["workspaces"] == RUNTIME_BYTES      # (training: the backward's thread too)
    assert full.host_pinned == 3 * full.weights                         # no gradient homes
    after = estimate(TINY, task="full", step_in_backward=False, link_gbps=None)
    assert after.host_pinned == 4 * after.weights
    assert full.floor_s is None and "not measured" in full.table()
    lora = estimate(TINY, task="lora", link_gbps=None)
    assert lora.least_budget > estimate(TINY, task="generate", link_gbps=None).least_budget


def test_gpu_memory_chooses_the_largest_budget_within_it():
    least = estimate(TINY, task="full", batch=2, seq=64, link_gbps=None)
    bound = least.least_gpu + (1 << 20)
    e = estimate(TINY, task="full", batch=2, seq=64, gpu_memory=bound, link_gbps=None)
    # (a sixteenth of the bound is the margin for the estimate's error)
    assert e.gpu_total == bound and e.gpu["margin"] == bound // 16
    assert least.least_budget < e.budget < least.least_budget + (1 << 20)
    tight = estimate(TINY, task="full", batch=2, seq=64, gpu_memory=least.least_gpu,
                     link_gbps=None)
    assert 0 <= tight.budget - least.least_budget < 16 and tight.gpu_total <= least.least_gpu
    # more than the weights need: the budget keeps them all resident (the weights
    # and, training, a step's room beside them: the plan's window with its copies
    # home, TRAINING_EXTRA + TRAINING_HOMES of the largest trainable unit), and
    # the process is less than the bound; nothing crosses the link
    roomy = estimate(TINY, task="full", batch=2, seq=64, gpu_memory="64GiB", link_gbps=None)
    largest = roomy.least_budget // (2 + TRAINING_EXTRA)    # (ahead 1: two streamed, and a step)
    assert roomy.least_budget == (2 + TRAINING_EXTRA) * largest
    assert roomy.budget == roomy.weights + (TRAINING_EXTRA + TRAINING_HOMES) * largest
    assert roomy.gpu_total < 64 << 30
    assert estimate(TINY, task="full", batch=2, seq=64, gpu_memory="64GiB",
                    link_gbps=50.0).floor_s == 0                   # nothing crosses the link
    assert roomy.gpu["slots"] == roomy.budget
    served = estimate(TINY, task="generate", batch=2, seq=64, gpu_memory="64GiB", link_gbps=None)
    assert served.budget == served.weights
    with pytest.raises(ValueError, match=r"cannot hold this full fine-tune at batch 2 x 64 "
                                         r"tokens: the least that works is .*slots .*activations"):
        estimate(TINY, task="full", batch=2, seq=64, gpu_memory=least.least_gpu - 1,
                 link_gbps=None)
    with pytest.raises(ValueError, match="not both"):
        estimate(TINY, budget="1MiB", gpu_memory="1GiB", link_gbps=None)


def test_what_the_process_holds_before_counts_and_activations_go_home_only_when_they_must():
    """offload's gpu_memory measures what the process holds already (its
    CUDA context): a part of its own, so the budget is that much less. With
    activations_home="auto", saved activations go home only when the bound
    cannot hold them on the GPU, leaving at most two of offload_activations'
    windows of them there."""
    from torch_uvm.estimate import ACTIVATIONS_WINDOW
    big = dict(task="full", batch=1024, seq=1024, link_gbps=None)
    free = estimate(TINY, gpu_memory="64GiB", **big)
    held = estimate(TINY, gpu_memory="64GiB", taken=3 << 30, **big)
    assert held.gpu["held before the offload"] == 3 << 30 and "held before" not in str(free.gpu)
    assert held.gpu_total == free.gpu_total + (3 << 30)
    on_gpu = estimate(TINY, budget=free.least_budget, **big)
    home = estimate(TINY, budget=free.least_budget, activations_home=True, **big)
    saved = 2 * 1024 * 1024 * 256 * 4    # each layer's input: layers x tokens x hidden, fp32
    assert saved > 2 * ACTIVATIONS_WINDOW and home.activations_home
    assert on_gpu.gpu["activations"] - home.gpu["activations"] == saved - 2 * ACTIVATIONS_WINDOW
    between = (home.least_gpu + on_gpu.least_gpu) // 2
    with pytest.raises(ValueError, match="or send activations home"):
        estimate(TINY, gpu_memory=between, **big)
    chosen = estimate(TINY, gpu_memory=between, activations_home="auto", **big)
    assert chosen.activations_home and chosen.gpu_total <= between
    assert "saved activations home" in chosen.table()
    roomy = estimate(TINY, gpu_memory="64GiB", activations_home="auto", **big)
    assert not roomy.activations_home
    generating = estimate(TINY, task="generate", gpu_memory="64GiB", activations_home=True,
                          link_gbps=None)
    assert not generating.activations_home
    for bad in (dict(activations_home="yes"), dict(taken=-1), dict(taken=1.5)):
        with pytest.raises(ValueError, match="activations_home|taken"):
            estimate(TINY, link_gbps=None, **bad)


def test_gpu_memory_as_people_write_it():
    """A size, bytes; a fraction of the card or "auto" need the card, and
    without a GPU say so; a bad string names the forms, "auto" among them."""
    from torch_uvm.sizes import card_bytes
    assert card_bytes("24GiB", "gpu_memory") == 24 << 30
    assert card_bytes(5 << 30, "gpu_memory") == 5 << 30 and card_bytes(None, "x") is None
    with pytest.raises(ValueError, match="'auto'"):
        card_bytes("24 gigs", "gpu_memory")
    if not torch.cuda.is_available():
        for v in ("auto", 0.5):
            with pytest.raises(ValueError, match="no GPU here"):
                card_bytes(v, "gpu_memory")
    else:
        total = torch.cuda.mem_get_info()[1]
        assert card_bytes(0.5, "gpu_memory") == total // 2
        assert total * 0.9 < card_bytes("auto", "gpu_memory") < total


def test_a_model_that_fits_whole_is_bounded_by_no_link():
    """Every weight resident: the link moves nothing, and the table says so
    (not a rate over a floor of zero)."""
    e = estimate(TINY, task="generate", gpu_memory="64GiB", link_gbps=50.0)
    assert e.budget >= e.weights and not e.floor_s
    assert "bounds nothing" in e.table() and "tokens/s" not in e.table()
    streamed = estimate(TINY, task="generate", budget=e.least_budget, link_gbps=50.0)
    assert streamed.floor_s > 0 and "tokens/s" in streamed.table()


def test_estimate_refuses_what_it_cannot_read(tmp_path):
    for kwargs, what in [(dict(task="train"), "task"), (dict(units="blocks"), "units"),
                         (dict(dtype="int8"), "dtype"), (dict(batch=0), "batch"),
                         (dict(seq=1.5), "seq"), (dict(budget="8G"), "size")]:
        with pytest.raises(ValueError, match=what if what != "size" else "unit"):
            estimate(TINY, link_gbps=None, **kwargs)
    with pytest.raises(ValueError, match="hidden_size"):
        estimate({"model_type": "bert", "num_hidden_layers": 2, "num_attention_heads": 2,
                  "vocab_size": 10}, link_gbps=None)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    assert estimate(str(folder), link_gbps=None).weights == estimate(TINY, link_gbps=None).weights


def test_the_estimate_command_runs_without_a_gpu(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    run = lambda *a: subprocess.run([sys.executable, "-m", "torch_uvm", "estimate", *a],  # noqa
                                    capture_output=True, text=True, cwd=ROOT, timeout=300)
    r = run(str(config), "--task", "full", "--budget", "64MiB", "--batch", "4", "--seq", "128")
    assert r.returncode == 0, r.stderr
    assert "process GPU memory" in r.stdout and "host memory" in r.stdout
    if not torch.cuda.is_available():
        assert "not measured: no GPU here" in r.stdout
    r = run(str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "error:" in r.stderr


def test_the_estimate_is_within_its_targets_on_every_committed_run():
    import estimate_check
    rows = estimate_check.check()
    assert set(estimate_check.MISSES) <= {row["case"] for row in rows}
    for row in rows:
        missed = row["miss"][0] if row["miss"] else ""
        assert missed in ("", "gpu", "host", "gpu and host") and (not missed or row["miss"][1]), \
            row
        # a known miss says why, and leaves the list once it is within
        within = 0.9 <= row["gpu_estimate"] / row["gpu_measured"] <= 1.1
        assert within != ("gpu" in missed), row
        if row["host_measured"]:
            within = 0.9 <= row["host_estimate"] / row["host_measured"] <= 1.1
            assert within != ("host" in missed), row
        else:
            assert "host" not in missed, row
        if row["measured_s"]:
            assert row["floor_s"] <= row["measured_s"], row


def test_a_model_on_the_meta_device_is_estimated_by_the_units_offload_makes():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items()
                                         if k not in ("model_type", "torch_dtype")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    from torch_uvm.estimate import module_units
    made = module_units(model, "submodules")
    assert sum(made) == sum(t.nbytes for t in {id(t): t for t in
                                               [*model.parameters(), *model.buffers()]}.values())
    by_model = estimate(model, task="generate", link_gbps=None)
    by_config = estimate(TINY, task="generate", link_gbps=None)
    assert by_model.weights == sum(made)
    assert by_model.least_budget == by_config.least_budget       # the same largest unit
    layers = estimate(model, task="generate", units="layers", link_gbps=None)
    assert layers.least_budget == 2 * max(module_units(model, "layers"))
    with pytest.raises(ValueError, match="pass inputs="):
        estimate(torch.nn.Linear(2, 2), link_gbps=None)


def test_a_module_without_a_config_is_estimated_from_one_forward_on_the_meta_device():
    """inputs=: the activations are what the forward saves for backward (its
    own weights left out, a weight saved transposed among them), and the
    largest tensor an operation makes; the module's own tensors are not
    touched, wherever they are."""
    width, batch, layers = 256, 8, 4
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                  for _ in range(layers)], torch.nn.ReLU())
    before = [p.clone() for p in model.parameters()]
    x = torch.randn(batch, width)
    e = estimate(model, task="full", budget=width * width * 4, inputs=x, autocast=False,
                 link_gbps=None)
    row = batch * width * 4
    # each Linear saves its input, ReLU its output; the largest op output is one row block
    assert e.gpu["activations"] == (layers + 1) * row + row
    assert e.gpu["logits"] == 2 * row                 # the output and its gradient
    assert e.weights == layers * width * width * 4 and (e.batch, e.seq) == (batch, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    generation = estimate(model, task="generate", budget=width * width * 4, inputs=x,
                          link_gbps=None)
    assert generation.gpu["activations"] == row and "gradients in flight" not in generation.gpu
    with torch.device("meta"):
        on_meta = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                        for _ in range(layers)], torch.nn.ReLU())
    assert estimate(on_meta, task="full", budget=width * width * 4, inputs=x, autocast=False,
                    link_gbps=None).gpu == e.gpu
    with pytest.raises(ValueError, match="inputs are the forward's arguments"):
        estimate(model, inputs=3, link_gbps=None)
    with pytest.raises(ValueError, match="inputs run a module's forward"):
        estimate(TINY, inputs=x, link_gbps=None)
    with pytest.raises(ValueError, match="could not run the module's forward on the meta"):
        estimate(model, inputs=torch.randn(batch, width + 1), link_gbps=None)
    with pytest.raises(ValueError, match="must be arguments Sequential.forward takes"):
        estimate(model, inputs={"mask": x}, link_gbps=None)
    with pytest.raises(ValueError, match="pass batch= and seq= for a config, not with inputs"):
        estimate(model, inputs=x, batch=4, link_gbps=None)
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(ValueError, match="none of this module's parameters requires grad"):
        estimate(frozen, task="lora", inputs=torch.randn(2, 4), link_gbps=None)


class Tokens(torch.nn.Module):
    """Token ids in, an embedding, then a Linear over (batch, seq, hidden)
    and one the same again (its input saved as a view, (batch x seq, hidden))."""

    def __init__(self, vocab=16, hidden=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.up, self.act, self.down = (torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                        torch.nn.Linear(hidden, hidden))

    def forward(self, ids, scale=None):
        h = self.act(self.up(self.embed(ids)))
        return self.down(h) * (1 if scale is None else scale)


def test_a_traced_estimate_counts_a_tensor_saved_also_as_its_view_once_and_reads_token_ids():
    model, (batch, seq, hidden) = Tokens(), (2, 5, 8)
    ids = torch.zeros(batch, seq, dtype=torch.long)
    e = estimate(model, task="full", budget=1 << 20, inputs=ids, autocast=False,
                 link_gbps=None)
    assert (e.batch, e.seq) == (batch, seq)
    row = batch * seq * hidden * 4
    # saved: the ids, the embedding's output, ReLU's output (the second Linear's
    # input is a view of it: counted once); the output's gradient too
    assert e.gpu["activations"] == batch * seq * 8 + 2 * row + row
    by_name = estimate(model, task="full", budget=1 << 20, inputs={"ids": ids}, autocast=False,
                       link_gbps=None)
    assert by_name.gpu == e.gpu
    features = estimate(torch.nn.Linear(hidden, hidden), task="generate", budget=1 << 20,
                        inputs=torch.randn(batch, seq, hidden), link_gbps=None)
    assert (features.batch, features.seq) == (batch, seq)


def test_a_hugging_face_model_with_inputs_is_refused_for_its_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items()
                                         if k not in ("model_type", "torch_dtype")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="a Hugging Face model is estimated from its config"):
        estimate(model, inputs=torch.zeros(1, 4, dtype=torch.long), link_gbps=None)


def test_a_models_eager_attention_counts_its_probabilities():
    """A model whose config says eager attention keeps each layer's
    probabilities (Korthikanti's 5 heads seq / hidden term); a config file,
    which does not record it, and an sdpa model do not, unless asked."""
    transformers = pytest.importorskip("transformers")
    kwargs = {k: v for k, v in TINY.items() if k not in ("model_type", "torch_dtype")}
    with torch.device("meta"):
        eager, sdpa = (transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **kwargs, attn_implementation=a)).to(torch.bfloat16) for a in ("eager", "sdpa"))
    # (checkpointed: without it, a model's own forward is read, not the formula)
    common = dict(task="full", budget=1 << 22, batch=2, seq=8, checkpointing=True,
                  link_gbps=None)
    layer = lambda extra: 2 * 8 * 256 * (34 + extra) * 2 / 2
    inputs = 2 * (2 * 8) * 256 * 2      # each of the 2 layers' input, bf16
    assert estimate(eager, **common).gpu["activations"] == int(inputs + layer(5 * 4 * 8 / 256))
    assert estimate(sdpa, **common).gpu["activations"] == int(inputs + layer(0))
    # (a config's full fine-tune keeps its weights, and so the inputs, in fp32)
    assert estimate(TINY, **common).gpu["activations"] == int(2 * inputs + layer(0))
    assert estimate(TINY, eager_attention=True, **common).gpu["activations"] == \
        int(2 * inputs + layer(5 * 4 * 8 / 256))


@pytest.mark.parametrize("extra, what", [
    ({"num_local_experts": 8}, r"experts \(num_local_experts=8\)"),
    ({"num_experts": 60}, r"experts \(num_experts=60\)"),
    ({"is_encoder_decoder": True}, "an encoder beside its decoder"),
])
def test_a_config_the_formulas_would_miscount_is_refused(extra, what):
    """Experts or an encoder: the dense formulas would count too few
    weights, so a bound made from them could be passed; the error names the
    model on the meta device as the way. One expert is a dense model."""
    with pytest.raises(ValueError, match=what + ".*meta device"):
        estimate({**TINY, **extra}, link_gbps=None)
    assert estimate({**TINY, "num_local_experts": 1}, link_gbps=None).weights == \
        estimate(TINY, link_gbps=None).weights


def test_a_model_trained_without_checkpointing_is_estimated_from_its_own_forward():
    """A Hugging Face model trained without checkpointing: what its own
    forward saves for backward, read on a meta twin in the activations'
    dtype, not the formula (GPT-2's forward saves about twice the formula's
    layers: a GPT-2 1.2B bounded by it took 19.62 of 19 GiB). Its hooks
    are not run, nor is it touched, nor its offload's handle copied; its
    config gives the same. The saved activations stay from forward to
    backward: the allocator's cache is half of a layer's work and the
    logits. A forward that cannot run on the meta device warns, and the
    formula counts."""
    transformers = pytest.importorskip("transformers")
    from torch_uvm.estimate_trace import decoder_trace
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                     vocab_size=128, attn_pdrop=0.0, resid_pdrop=0.0,
                                     embd_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)      # fp32, on the CPU
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ran = []
    model.register_forward_pre_hook(lambda *_: ran.append(1))

    class Handle:     # (an offload's mark holds its handle, and through it every home)
        def __deepcopy__(self, memo):
            raise AssertionError("the offload's handle was copied")
    model._torch_uvm_offloaded = Handle()
    accelerate = pytest.importorskip("accelerate")     # (its hook replaces the forward)
    accelerate.hooks.add_hook_to_module(model, accelerate.hooks.ModelHook())
    common = dict(task="full", budget=1 << 20, batch=2, seq=16, checkpointing=False,
                  link_gbps=None)
    layer = 2 * 16 * 64 * 34 * 2 / 2        # the formula's layer under bf16 autocast
    read = decoder_trace(model, 2, 16, torch.bfloat16)
    e = estimate(model, **common)
    assert e.gpu["activations"] == int(read.saved + layer)
    assert e.gpu["activations"] > int(2 * layer)                 # more than the formula says
    assert e.gpu["allocator's cache"] == int(CACHE_SHARE * (int(layer) + e.gpu["logits"]))
    # (its peak is the loss's: the first gradients are made in the loss's freed buffers)
    assert e.gpu["gradients in flight"] > 0
    assert e.gpu["logits"] == max(0, 2 * 16 * 128 * (2 + 4 + 4) - e.gpu["gradients in flight"])
    assert estimate(model, autocast=False, **common).gpu["activations"] == \
        int(decoder_trace(model, 2, 16, torch.float32).saved + 2 * layer)
    assert ran == [] and all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert estimate(config.to_dict(), **common).gpu["activations"] == e.gpu["activations"]

    class Refuse(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("no meta device here")
    fails = transformers.GPT2LMHeadModel(config)
    fails.transformer.h[0].mlp.act = Refuse()
    with pytest.warns(UserWarning, match=r"could not read this model's forward on the meta "
                                         r"device \(its forward raised there, RuntimeError: no "
                                         r"meta device here\)"):
        fallback = estimate(fails, **common)
    assert fallback.gpu["activations"] == int(2 * layer)
    # (the formula's activations keep the cache they were fitted with)
    assert fallback.gpu["allocator's cache"] == \
        int(CACHE_SHARE * (fallback.gpu["activations"] + fallback.gpu["logits"]))


def test_an_attention_is_counted_as_the_fused_kernels_save_it():
    """scaled_dot_product_attention on the meta device runs its math, which
    keeps the probabilities (batch x heads x seq x seq); a GPU runs a fused
    kernel, which keeps its query, key, value and output. Eager attention
    keeps the probabilities."""
    from torch_uvm.estimate_trace import trace

    class Attention(torch.nn.Module):
        def __init__(self, eager):
            super().__init__()
            self.qkv, self.eager = torch.nn.Linear(64, 192), eager

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
            if self.eager:
                return ((q @ k.transpose(-1, -2)).softmax(-1) @ v).sum()
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()
    x = torch.zeros(2, 128, 64)
    inputs, qkv, out, probs = x.nbytes, 2 * 128 * 192 * 4, 2 * 4 * 128 * 16 * 4, 2 * 4 * 128 * 128 * 4
    sdpa = trace(Attention(False), x, True)
    assert sdpa.saved == inputs + qkv + out and sdpa.largest == qkv
    assert trace(Attention(True), x, True).saved == inputs + qkv + probs
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
    frozen = Attention(False).requires_grad_(False)       # (nothing needs its gradient)
    assert trace(frozen, x, True).saved == 0


def test_the_attentions_wrapper_is_taken_away_by_the_last_trace_in_any_thread():
    """Traces in two threads, the first to enter leaving first: the last
    to leave puts scaled_dot_product_attention back."""
    import threading
    from torch_uvm.estimate_trace import _FusedAttention
    original = torch.nn.functional.scaled_dot_product_attention
    entered, left = threading.Event(), threading.Event()

    def other():
        with _FusedAttention(lambda t: None):
            entered.set()
            left.wait(10)
    with _FusedAttention(lambda t: None):
        worker = threading.Thread(target=other)
        worker.start()
        entered.wait(10)
    assert torch.nn.functional.scaled_dot_product_attention is not original   # (B's still in)
    left.set()
    worker.join()
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_a_forward_bound_on_the_instance_runs_on_the_twin():
    """A method bound to the module itself (a forward patched in, as some
    kernels' libraries do) runs on the twin, not on the module's weights."""
    import types
    from torch_uvm.estimate_trace import meta_twin, trace
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    model.forward = types.MethodType(lambda self, x: self[1](self[0](x)) * 2, model)
    twin = meta_twin(model)
    assert twin.forward.__self__ is twin and twin[0].weight.is_meta
    assert trace(model, torch.zeros(4, 8), True).saved == \
        trace(twin, torch.zeros(4, 8), True).saved > 0


def test_a_host_step_gives_its_streamed_weights_gradient_homes():
    """With host_step, the streamed weights stepped on the host have
    gradient homes: what the plan streams is the weights less what it keeps
    resident (the budget less the least budget and the copies' share of
    it). By hand on TINY in fp32 (6.5 MiB) under a 5 MiB budget."""
    from torch_uvm.host_step import COPIES_AHEAD_SHARE
    budget = 5 << 20
    common = dict(task="full", budget=budget, batch=2, seq=8, link_gbps=None)
    plain = estimate(TINY, **common)
    resident = budget - plain.least_budget - int(COPIES_AHEAD_SHARE * budget)
    assert 0 < resident < plain.weights
    streamed = plain.weights - resident
    assert plain.host_pinned == 3 * plain.weights
    assert estimate(TINY, host_step=1.0, **common).host_pinned == 3 * plain.weights + streamed
    assert estimate(TINY, host_step=0.5, **common).host_pinned == \
        3 * plain.weights + int(0.5 * streamed)
    # stepping after backward, every gradient has its home already
    after = dict(common, step_in_backward=False)
    assert estimate(TINY, host_step=1.0, **after).host_pinned == 4 * plain.weights
    for bad in (-0.1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="host_step is a share from 0 to 1"):
            estimate(TINY, host_step=bad, **common)
    # the gradients copying home sit beside the slots: an eighth of the budget,
    # less the gradients in flight counted already; under gpu_memory,
    # stream_optimizer holds them to those (HostSteps.copies_cap)
    deep, big = dict(TINY, num_hidden_layers=64), dict(common, budget=64 << 20)
    e = estimate(deep, host_step=1.0, **big)
    assert e.gpu["gradients copying home"] == \
        int(COPIES_AHEAD_SHARE * (64 << 20)) - e.gpu["gradients in flight"] > 0
    assert e.gpu_total == estimate(deep, **big).gpu_total + e.gpu["gradients copying home"]
    assert "gradients copying home" not in estimate(deep, host_step=1.0, **dict(
        big, budget=None, gpu_memory=1 << 30)).gpu


def test_the_least_bound_is_the_least_whose_margin_leaves_the_process():
    from torch_uvm.estimate import MARGIN_PARTS, least_bound
    for process in list(range(1, 4000)) + [10 ** 10 + 7, (3 << 30) + 5]:
        b = least_bound(process)
        assert b - b // MARGIN_PARTS >= process > (b - 1) - (b - 1) // MARGIN_PARTS


def test_a_lora_from_its_config_counts_the_adapters_as_the_peft_model_offload_makes():
    """A LoRA estimated from a config counts PEFT's adapters (rank 16, fp32,
    on the seven projections, grouped-query k and v narrower) among the
    weights, as the PEFT model's measured units do; so a roomy gpu_memory
    chooses the same budget, the one that keeps every weight resident."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items()
                                         if k not in ("model_type", "torch_dtype")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                  "up_proj", "down_proj"]))
    for p in model.parameters():      # (PEFT makes adapters in the base's dtype on meta)
        if p.requires_grad:
            p.data = p.data.float()
    shapes = dict(task="lora", batch=2, seq=64, link_gbps=None, taken=0, gpu_memory="64GiB")
    by_model, by_config = estimate(model, **shapes), estimate(TINY, **shapes)
    buffers = sum(b.nbytes for b in model.buffers())   # (the rotary tables: the module's alone)
    assert by_config.weights + buffers == by_model.weights
    assert by_config.budget + buffers == by_model.budget > by_model.weights


def test_a_full_fine_tune_moves_at_least_its_least_placement_each_step():
    """By hand, 12 GiB of weights (24 of AdamW's states): under 8 GiB, every
    weight streams but 8 resident alone: 16 GiB to the GPU (2 W - B); under
    14, 1 GiB keeps its states (3 bytes a byte), the rest resident alone:
    11 GiB each way ((3 W - B) / 2); under 36 nothing crosses. Under
    autocast the bf16 casts may cross in their place: W - B, half or less."""
    G = 1 << 30
    assert least_full_crossing(12 * G, 8 * G, casts=False) == 16 * G
    assert least_full_crossing(12 * G, 14 * G, casts=False) == 11 * G
    assert least_full_crossing(12 * G, 36 * G, casts=False) == 0
    assert least_full_crossing(12 * G, 8 * G, casts=True) == 4 * G
    assert least_full_crossing(12 * G, 14 * G, casts=True) == 0
    roomy = estimate(TINY, task="full", batch=2, seq=64, gpu_memory="64GiB", link_gbps=50.0,
                     autocast=False)
    assert roomy.budget < 3 * roomy.weights    # every weight resident, its states not
    assert roomy.floor_s == pytest.approx((3 * roomy.weights - roomy.budget) // 2 / 50e9)


def test_estimate_check_sums_the_keys_a_run_splits_its_measure_into():
    """load_llama counts the host from its start: the whole process is its
    peak and its start together, "host_peak_bytes+host_base_bytes"."""
    import estimate_check
    run = {"host_peak_bytes": 13, "host_base_bytes": 1, "gpu": {"peak": 5}}
    assert estimate_check.dig(run, "host_peak_bytes+host_base_bytes") == 14
    assert estimate_check.dig(run, "gpu.peak+host_base_bytes") == 6
    assert estimate_check.dig(run, "host_peak_bytes+missing") is None


def test_a_host_step_under_a_budget_that_keeps_every_weight_resident_sends_nothing_home():
    """host_step steps the streamed units on the host: under a budget of
    the weights and a step's room, none streams (the 7B in bf16 under 24 GiB
    kept 293 of 293 units resident with host_step=1), so no gradient goes
    home and none waits beside the slots."""
    roomy = estimate(TINY, task="full", batch=2, seq=64, gpu_memory="64GiB", link_gbps=None,
                     autocast=False)
    stepped = estimate(TINY, task="full", batch=2, seq=64, budget=roomy.budget, link_gbps=None,
                       autocast=False, host_step=1.0)
    assert stepped.host_pinned == 3 * stepped.weights
    assert "gradients copying home" not in stepped.gpu or not stepped.gpu["gradients copying home"]
    tight = estimate(TINY, task="full", batch=2, seq=64, budget=roomy.least_budget * 2,
                     link_gbps=None, autocast=False, host_step=1.0)
    assert tight.host_pinned > 3 * tight.weights      # streamed units' gradients have homes
