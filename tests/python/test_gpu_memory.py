"""offload's gpu_memory without a GPU: what it reads of the module (the
task, a forward's tokens), what it refuses before anything is pinned, and
its check of each forward against the plan (gpu_memory.py). The bound's
memory, measured, is test_gpu_bound.py's."""
import inspect

import pytest
import torch

from torch_uvm.estimate import estimate
from torch_uvm.offload_state import TRAINING_EXTRA, TRAINING_HOMES
from torch_uvm.gpu_memory import ProcessBound, argument_shapes, beyond, task_of, tokens_of

def tiny_llama(**extra):
    transformers = pytest.importorskip("transformers")    # (the MLP's tests need none)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=128, **extra)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def bound_for(model, limit, batch, seq, taken=0):
    """The bound offload would make, with `taken` held before (what
    plan_for measures with mem_get_info)."""
    options = dict(checkpointing=False, ahead=1, units="submodules", autocast=False,
                   new_tokens=0, link_gbps=None, taken=taken, activations_home="auto")
    plan = estimate(model, task=task_of(model), gpu_memory=limit, batch=batch, seq=seq,
                    **options)
    options["activations_home"] = plan.activations_home
    return ProcessBound(model, limit, taken, plan, options)


def bound_sending_home(model):
    """A bound between what a full fine-tune at batch 512 x 1024 without
    checkpointing needs with its saved activations home and without: the
    bound, and the estimate without."""
    big = dict(batch=512, seq=1024)
    on_gpu = estimate(model, task="full", link_gbps=None, taken=0, autocast=False,
                      checkpointing=False, **big)
    home = estimate(model, task="full", link_gbps=None, taken=0, autocast=False,
                    checkpointing=False, activations_home=True, **big)
    return bound_for(model, (home.least_gpu + on_gpu.least_gpu) // 2, **big), on_gpu


def test_the_task_is_read_from_the_module():
    model = tiny_llama()
    assert task_of(model.train()) == "full"
    assert task_of(model.eval()) == "generate"
    model.train()
    for name, p in model.named_parameters():
        p.requires_grad_("q_proj" in name)
    assert task_of(model) == "lora"
    for p in model.parameters():
        p.requires_grad_(False)
    assert task_of(model) == "generate"


def test_a_forwards_tokens_count_what_its_cache_holds():
    transformers = pytest.importorskip("transformers")
    ids = torch.zeros(3, 7, dtype=torch.long)
    assert tokens_of((ids,), {}) == (3, 7)
    assert tokens_of((), {"input_ids": ids}) == (3, 7)
    assert tokens_of((), {"inputs_embeds": torch.zeros(2, 5, 64)}) == (2, 5)
    assert tokens_of((torch.zeros(4),), {}) is None and tokens_of((), {}) is None
    cache = transformers.DynamicCache()
    model = tiny_llama().eval()
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"     # (transformers' later name for it)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{name: cache})
    assert tokens_of((), {"input_ids": ids[:, :1], name: cache}) == (3, 8)
    # generate's 2-D attention mask covers the cached tokens and the new
    assert tokens_of((), {"input_ids": ids[:, :1], "attention_mask": torch.ones(3, 9)}) == (3, 9)
    legacy = tuple((torch.zeros(3, 2, 6, 16),) * 2 for _ in range(2))     # ((keys, values), ...)
    assert tokens_of((), {"input_ids": ids[:, :1], "past_key_values": legacy}) == (3, 7)


class CountedOnTheGpu:
    """A static cache as transformers makes it: its count is a tensor (on the
    GPU, reading it waits for the GPU), its length a number."""

    def get_seq_length(self):
        return torch.tensor(5)

    def get_max_length(self):
        return 40


def test_a_static_cache_counts_its_length_without_reading_its_count():
    transformers = pytest.importorskip("transformers")
    ids = torch.zeros(3, 1, dtype=torch.long)
    assert tokens_of((), {"input_ids": ids, "past_key_values": CountedOnTheGpu()}) == (3, 40)
    assert tokens_of((), {"input_ids": ids, "attention_mask": torch.ones(3, 6),
                          "past_key_values": CountedOnTheGpu()}) == (3, 40)
    config = tiny_llama().config
    try:
        cache = transformers.StaticCache(config=config, max_cache_len=40)
    except TypeError:           # (an older transformers' signature)
        pytest.skip("this transformers' StaticCache takes other arguments")
    if not hasattr(cache, "get_max_length"):
        pytest.skip("this transformers' static cache has no get_max_length")
    model = tiny_llama().eval()
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"
    with torch.no_grad():
        model(input_ids=torch.zeros(3, 7, dtype=torch.long), use_cache=True, **{name: cache})
    assert tokens_of((), {"input_ids": ids, name: cache}) == (3, 40)


def test_a_forward_beyond_the_plan_is_refused_before_it_runs_and_one_within_passes():
    model = tiny_llama().train()
    least = estimate(model, task="full", batch=2, seq=16, link_gbps=None, taken=0,
                     autocast=False, checkpointing=False)
    bound = bound_for(model, least.least_gpu + (1 << 20), batch=2, seq=16)
    # (the budget that keeps every weight resident, if less: the weights and a step's room)
    whole = least.weights + (TRAINING_EXTRA + TRAINING_HOMES) * (least.least_budget // 5)
    assert bound.budget == min(least.least_budget + (1 << 20), whole)
    ids = torch.zeros(2, 16, dtype=torch.long)
    bound.check((ids,), {})                       # the plan's own shape
    bound.check((ids[:1, :8],), {})               # smaller
    with pytest.raises(ValueError, match=r"full fine-tune, batch 64 x 1024 tokens\) would take "
                                         r"about .* above the offload's gpu_memory .* planned "
                                         r"for batch 2 x 16 .*Nothing of it ran"):
        bound.check((torch.zeros(64, 1024, dtype=torch.long),), {})
    with torch.no_grad():         # a generation after a training plan: estimated as one
        bound.check((ids[:1],), {})
        with pytest.raises(ValueError, match=r"\(generation, batch 512 x 4096 tokens\)"):
            bound.check((torch.zeros(512, 4096, dtype=torch.long),), {})


def test_a_bound_too_small_is_refused_naming_the_least_and_what_takes_it():
    model = tiny_llama().train()
    with pytest.raises(ValueError, match=r"cannot hold this full fine-tune at batch 8 x 512 "
                                         r"tokens: the least that works is .*held before the "
                                         r"offload 1.00 GiB, slots"):
        bound_for(model, 1 << 30, batch=8, seq=512, taken=1 << 30)


def test_training_without_checkpointing_sends_activations_home_when_it_must():
    """Where the activations do not fit on the GPU beside the slots but fit
    home, the plan sends them home, and the bound enters
    offload_activations for each forward that builds a graph (not one
    without grad), leaving it at the forward's end."""
    model = tiny_llama().train()
    bound, on_gpu = bound_sending_home(model)
    assert bound.plan.activations_home and "saved activations home" in bound.describe()
    hooks = torch._C._autograd._top_saved_tensors_default_hooks
    bound.begin_forward()
    assert hooks(False) is not None
    bound.end_forward()
    assert hooks(False) is None
    with torch.no_grad():
        bound.begin_forward()
        assert hooks(False) is None
        bound.end_forward()
    bound.begin_forward()                 # a forward inside the forward: one context,
    bound.begin_forward()                 # left at the outer one's end
    bound.end_forward()
    assert hooks(False) is not None
    bound.end_forward()
    assert hooks(False) is None
    bound.end_forward()                   # (a refused forward's end: nothing to leave)
    assert hooks(False) is None
    roomy = bound_for(model, on_gpu.least_gpu * 4, batch=512, seq=1024)
    assert not roomy.plan.activations_home


def test_what_gpu_memory_cannot_size_is_refused_before_the_card_is_read():
    model = tiny_llama()
    cpu = torch.device("cpu")    # (each is refused before mem_get_info would be read)
    for batch, seq, match in ((None, 16, "pass batch="), (2, 0, "pass seq="),
                              (2, True, "pass seq=")):
        with pytest.raises(ValueError, match=match):
            ProcessBound.plan_for(model, "8GiB", cpu, batch, seq, 1, None)
    with pytest.raises(ValueError, match="no Hugging Face config .*: pass inputs="):
        ProcessBound.plan_for(torch.nn.Linear(4, 4), "8GiB", cpu, None, None, 1, None)
    x = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="this one has one .*: pass batch= and seq= instead"):
        ProcessBound.plan_for(model, "8GiB", cpu, None, None, 1, None, inputs=x)
    with pytest.raises(ValueError, match="pass one or the other"):
        ProcessBound.plan_for(torch.nn.Linear(4, 4), "8GiB", cpu, 2, None, 1, None, inputs=x)
    with pytest.raises(ValueError, match="'auto'"):
        ProcessBound.plan_for(model, "eight gigs", cpu, 1, 16, 1, None)


def test_offload_refuses_a_budget_beside_gpu_memory_and_a_plan_without_it():
    import torch_uvm
    model = tiny_llama()
    with pytest.raises(ValueError, match="a budget or gpu_memory, not both"):
        torch_uvm.offload(model, budget="1GiB", gpu_memory="8GiB", batch=1, seq=16)
    with pytest.raises(ValueError, match="pass gpu_memory= with them"):
        torch_uvm.offload(model, budget="1GiB", seq=16)
    with pytest.raises(ValueError, match="pass gpu_memory= with them"):
        torch_uvm.offload(model, budget="1GiB", inputs=torch.zeros(1, 16, dtype=torch.long))
    assert getattr(model, "_torch_uvm_offloaded", None) is None


def test_a_model_planned_for_generation_then_trained_is_checked_as_training():
    """Offloaded in eval() (as from_pretrained leaves it), then train(): a
    training forward at the planned shape is estimated as training and
    refused when that passes the bound, naming the plan's task."""
    model = tiny_llama().eval()
    shape = dict(batch=64, seq=512)
    generation = estimate(model, task="generate", link_gbps=None, taken=0, autocast=False,
                          checkpointing=False, new_tokens=0, **shape)
    bound = bound_for(model, generation.least_gpu + (1 << 20), **shape)
    assert bound.plan.task == "generate"
    ids = torch.zeros(64, 512, dtype=torch.long)
    with torch.no_grad():
        bound.check((ids,), {})
    model.train()
    with pytest.raises(ValueError, match=r"\(full fine-tune, batch 64 x 512 tokens\).*planned "
                                         r"for batch 64 x 512 as a generation.*undo\(\)"):
        bound.check((ids,), {})


def test_generation_under_a_training_plan_is_estimated_once(monkeypatch):
    """Each token of a generation has a new length: within the planned shape
    the generation is estimated once, at that shape, not once a token."""
    import torch_uvm.gpu_memory as gm
    model = tiny_llama().train()
    bound = bound_for(model, 64 << 30, batch=2, seq=64)
    calls = []
    real = gm.estimate
    monkeypatch.setattr(gm, "estimate", lambda *a, **k: calls.append(k) or real(*a, **k))
    with torch.no_grad():
        for length in range(1, 40):
            bound.check((torch.zeros(2, length, dtype=torch.long),), {})
    assert len(calls) == 1 and calls[0]["task"] == "generate" and calls[0]["seq"] == 64


def test_a_refused_forward_inside_another_ends_nothing_and_undo_leaves_the_context():
    model = tiny_llama().train()
    bound, on_gpu = bound_sending_home(model)
    hooks = torch._C._autograd._top_saved_tensors_default_hooks
    bound.begin_forward()                             # the outer forward
    with pytest.raises(ValueError, match="Nothing of it ran"):
        bound.check((torch.zeros(4096, 4096, dtype=torch.long),), {})   # an inner one, refused
    bound.end_forward()                               # (its end, called all the same)
    assert hooks(False) is not None                   # the outer one's context stays
    bound.close()                                     # undo() after an interrupted forward
    assert hooks(False) is None
    bound.end_forward()
    assert hooks(False) is None


def mlp(width=256):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                               torch.nn.Linear(4 * width, width)).train()


def traced_bound(model, inputs, limit=None):
    """The bound offload(model, gpu_memory=limit, inputs=inputs) would make
    (by default the least that holds a full fine-tune at `inputs`' shapes,
    and 8 MiB), nothing held before, its check hooked on the module's
    forward as offload hooks it (offload.hook_forward)."""
    options = dict(checkpointing=False, ahead=1, units="submodules", autocast=False,
                   new_tokens=0, link_gbps=None, taken=0, activations_home="auto")
    if limit is None:
        limit = estimate(model, task="full", inputs=inputs, **options).least_gpu + (8 << 20)
    plan = estimate(model, task=task_of(model), gpu_memory=limit, inputs=inputs, **options)
    options["activations_home"] = plan.activations_home
    bound = ProcessBound(model, limit, 0, plan, options, inputs)
    model.register_forward_pre_hook(lambda _m, args, kwargs: bound.check(args, kwargs),
                                    with_kwargs=True)
    return bound


BEYOND = r"would take about .* Nothing of it ran: give smaller inputs"


def test_a_module_planned_from_its_inputs_passes_forwards_within_their_shapes_alone():
    """Within the planned inputs' shapes, dimension by dimension, a forward
    passes, by position or by name; a larger one is traced again at its own
    shapes, on a meta copy of the module (the module's own forward, hooked,
    would check itself again), and refused, naming what passed the plan,
    before anything of it runs."""
    model = mlp()
    x = torch.zeros(64, 256)
    bound = traced_bound(model, x)
    assert bound.planned == {"input": (((64, 256), torch.float32),)}
    model(x)
    model(x[:8])
    model(input=x)
    with pytest.raises(ValueError, match=r"\(full fine-tune, its inputs beyond the planned ones: "
                                         r"input \[65536, 256\] float32, planned \[64, 256\] "
                                         r"float32\) " + BEYOND):
        model(torch.zeros(64 * 1024, 256))
    with torch.no_grad():         # a generation at the planned shapes: estimated, it fits
        model(x)
    model.eval()                  # (the copy traced follows the module's modes)
    with torch.no_grad():
        model(x)


def test_a_larger_forward_that_fits_is_traced_once_a_shape_and_runs(monkeypatch):
    model = mlp()
    x = torch.zeros(64, 256)
    small = estimate(model, task="full", inputs=x, link_gbps=None, taken=0, autocast=False,
                     checkpointing=False)
    bound = traced_bound(model, torch.zeros(32, 256), small.least_gpu * 2)
    from torch_uvm import gpu_memory
    calls = []
    real = gpu_memory.estimate
    monkeypatch.setattr(gpu_memory, "estimate", lambda *a, **k: calls.append(k) or real(*a, **k))
    model(x)
    out = model(x)
    assert out.shape == (64, 256) and len(calls) == 1
    assert calls[0]["inputs"].args[0].shape == (64, 256)
    assert bound.twin is not model and next(bound.twin.parameters()).is_meta


class Wrapped(torch.nn.Module):
    """Forwards as users write them: varargs, keywords, None, a number."""

    def __init__(self):
        super().__init__()
        self.inner = mlp()

    def forward(self, *xs, mask=None, repeat=1, **extra):
        x = torch.cat(xs + tuple(extra.values()))
        for _ in range(repeat):
            x = self.inner(x)
        return x if mask is None else x * mask


def test_what_passes_a_traced_plan_in_any_argument_is_estimated_and_refused():
    model = Wrapped().train()
    x = torch.zeros(64, 256)
    traced_bound(model, (x,))
    big = torch.zeros(64 * 1024, 256)
    model(x, mask=None)                                   # within: mask left out
    with pytest.raises(ValueError, match=r"xs \[65536, 256\] float32, planned \[64, 256\]"):
        model(big, mask=None)                             # positional and keyword, *args
    with pytest.raises(ValueError, match=r"extra \(not as the planned inputs hold it\)"):
        model(x, extra=big)                               # **kwargs
    with pytest.raises(ValueError, match=r"repeat: 400, planned"):
        model(x, repeat=400)                              # a number the plan did not have
    with pytest.raises(ValueError, match=BEYOND):
        model(big)


def test_a_call_beyond_the_plan_is_named_dimension_by_dimension_in_no_wider_a_dtype():
    f = lambda a, b=None, n=1: None    # noqa: E731
    shapes = lambda *a, **k: argument_shapes(f, a, k)   # noqa: E731
    planned = shapes(torch.zeros(8, 16), b=torch.zeros(4))
    assert beyond(shapes(torch.zeros(8, 16)), planned) is None                    # b left out
    assert beyond(shapes(torch.zeros(2, 16), torch.zeros(4)), planned) is None    # b by position
    assert beyond(shapes(torch.zeros(2, 16), None), planned) is None              # b None
    assert beyond(shapes(torch.zeros(2, 32)), planned) == "a [2, 32] float32, planned [8, 16] float32"
    assert beyond(shapes(torch.zeros(8, 16, 1)), planned).startswith("a [8, 16, 1]")
    assert beyond(shapes(torch.zeros(8, 16, dtype=torch.float64)), planned)
    assert beyond(shapes(torch.zeros(8, 16, dtype=torch.bfloat16)), planned) is None
    assert beyond(shapes(torch.zeros(8, 16), None, 2), planned) == "n: 2, planned 1"
    assert beyond(shapes(torch.zeros(8, 16), torch.zeros(4)), shapes(torch.zeros(8, 16)))
    assert argument_shapes(f, (1, 2, 3, 4), {}) is None                          # does not bind
