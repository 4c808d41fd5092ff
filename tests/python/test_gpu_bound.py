"""offload's gpu_memory on a GPU, as users write it: the process's GPU
memory, measured apart from torch_uvm's books (``mem_get_info`` sampled
every millisecond, and PyTorch's allocator's peak beside what the process
held outside it before), stays within the bound while a Llama-architecture
model streams, for a generation, a LoRA-style fine-tune with activation
checkpointing, and a full fine-tune whose saved activations go home; a
bound too small, and a forward beyond the plan, are refused before
anything changes. The generation's and the fine-tune's bounds are chosen
so that the model streams (its budget a third of its weights)."""
import gc
import threading

import pytest
import torch

import torch_uvm
from conftest import gpu
from torch_uvm.estimate import least_bound
from offload_helpers import nothing_left_streamed  # noqa: F401 (autouse)

pytestmark = gpu


def llama(dtype=torch.float32, attention="sdpa"):
    """An 8-layer Llama of hidden 1024. Training compared bit for bit with
    all-resident takes eager attention: SDPA's memory-efficient backward
    (its kernel for fp32) adds with atomics, so two runs of it differ."""
    transformers = pytest.importorskip("transformers")    # (the MLP's test needs none)
    config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816,
                                      num_hidden_layers=8, num_attention_heads=16,
                                      num_key_value_heads=16, vocab_size=32000,
                                      attn_implementation=attention)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype)


def held_now() -> int:
    """The process's GPU memory now (the card is the test's alone), an
    earlier test's garbage collected."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return total - free


class ProcessPeak:
    """``with ProcessPeak() as p: ...``, then ``p.peak``: the larger of the
    sampled ``mem_get_info`` and, with UVM off, PyTorch's allocator's peak
    beside what the process held outside it at the start. (With UVM on, as
    conftest sets it for GPU runs, PyTorch's CUDA allocator is torch_uvm's
    managed one, and the slots come from PyTorch's own beside it: the
    allocator's figure would miss them, so the sampled one stands alone.)"""

    def __enter__(self):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        self.outside = total - free - torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        self.sampled, self._done = total - free, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.wait(0.001):
            free, total = torch.cuda.mem_get_info()
            self.sampled = max(self.sampled, total - free)

    def __exit__(self, *_):
        torch.cuda.synchronize()
        self._done.set()
        self._thread.join()
        self.allocator = 0 if torch_uvm.get_enabled_uvm() else \
            self.outside + torch.cuda.max_memory_reserved()
        self.peak = max(self.sampled, self.allocator)

    def report(self, bound: int) -> None:
        """Prints the peak beside the bound (the log keeps it), and asserts it."""
        print(f"process peak {self.peak / 2**30:.3f} GiB (sampled {self.sampled / 2**30:.3f}, "
              f"allocator {self.allocator / 2**30:.3f}) of a bound of {bound / 2**30:.3f} GiB")
        assert self.peak <= bound, (self.sampled, self.allocator, bound)


def bound_streaming(model, task, batch, seq, **options):
    """A gpu_memory whose budget is a third of the weights (so they
    stream), for what the process holds now."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    est = torch_uvm.estimate(model, task=task, budget=weights // 3, batch=batch, seq=seq,
                             new_tokens=0, autocast=False, link_gbps=None, taken=held_now(),
                             **options)
    return least_bound(est.gpu_total + SLACK), weights


SLACK = 64 << 20    # (what the process holds may move a little between here and offload's look)


def test_a_generation_stays_within_its_bound_and_makes_the_resident_tokens():
    model = llama(torch.bfloat16).eval()
    prompt = torch.randint(0, 32000, (4, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        resident = model.cuda().generate(prompt.cuda(), max_new_tokens=32, do_sample=False)
    model.cpu()
    bound, weights = bound_streaming(model, "generate", 4, 96, checkpointing=False)
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=4, seq=96)
    assert handle.state.bound.budget < weights
    with ProcessPeak() as p, torch.no_grad():
        tokens = model.generate(prompt.cuda(), max_new_tokens=32, do_sample=False)
    assert torch.equal(tokens, resident)
    p.report(bound)
    handle.undo()


def lora_style(model):
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith(("q_proj.weight", "v_proj.weight")))
    return model


def train(model, handle, batch, seq, steps=3):
    """`steps` AdamW steps of seeded random tokens; the losses. With
    handle None, the model all resident."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    if handle is not None:
        optimizer = handle.stream_optimizer(optimizer)
    losses = []
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        ids = torch.randint(0, 32000, (batch, seq), generator=gen).cuda()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def all_resident(make, batch, seq, steps):
    """The losses and trainable weights of `make()`'s model trained all
    resident, its GPU memory given back before the offloaded run."""
    model = make().cuda()
    losses = train(model, None, batch, seq, steps)
    weights = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    del model
    held_now()
    return losses, weights


def same_as(resident, model, losses):
    """The offloaded run's losses and (after undo) trainable weights equal
    all-resident's, bit for bit."""
    assert losses == resident[0]
    got = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    assert got.keys() == resident[1].keys()
    assert all(torch.equal(got[n], w) for n, w in resident[1].items())


def checkpointed_lora_style():
    model = lora_style(llama(attention="eager")).train()
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def test_a_checkpointed_lora_style_fine_tune_stays_within_its_bound():
    resident = all_resident(checkpointed_lora_style, 4, 512, 3)
    model = checkpointed_lora_style()
    bound, weights = bound_streaming(model, "lora", 4, 512, checkpointing=True)
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=4, seq=512)
    assert handle.state.bound.plan.task == "lora" and handle.state.bound.budget < weights
    assert not handle.state.bound.plan.activations_home
    with ProcessPeak() as p:
        losses = train(model, handle, 4, 512)
    p.report(bound)
    handle.undo()
    same_as(resident, model, losses)


def test_a_bound_with_room_for_every_weight_keeps_every_weight_resident():
    """A gpu_memory with room for the whole model (a 24 GiB card's for a
    7B in bf16): training streams nothing. A budget of the weights alone
    left no room for a step beside them, so a window of the weights
    streamed every step: the 7B's LoRA ran at 0.54 of all-resident's speed."""
    resident = all_resident(checkpointed_lora_style, 4, 512, 2)
    model = checkpointed_lora_style()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bound = held_now() + weights + (4 << 30)
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=4, seq=512)
    assert handle.state.bound.budget > weights
    with ProcessPeak() as p:
        losses = train(model, handle, 4, 512, steps=2)
    p.report(bound)
    assert len(handle.resident_units()) == len(handle.units_in_order())
    handle.undo()
    same_as(resident, model, losses)


def test_a_full_fine_tune_sends_its_activations_home_to_stay_within_its_bound():
    """Without checkpointing, a bound that holds the slots but not the
    saved activations: they go home (offload_activations), and the
    process stays within it."""
    def make():
        model = llama(attention="eager").train()
        model.config.use_cache = False
        return model

    batch, seq = 8, 512
    resident = all_resident(make, batch, seq, 2)
    model = make()
    taken = held_now()
    common = dict(task="full", batch=batch, seq=seq, autocast=False, checkpointing=False,
                  new_tokens=0, link_gbps=None, taken=taken)
    on_gpu = torch_uvm.estimate(model, **common)
    home = torch_uvm.estimate(model, activations_home=True, **common)
    bound = (home.least_gpu + on_gpu.least_gpu) // 2
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=batch, seq=seq)
    assert handle.state.bound.plan.activations_home
    with ProcessPeak() as p:
        losses = train(model, handle, batch, seq, steps=2)
    p.report(bound)
    handle.undo()
    same_as(resident, model, losses)


def test_a_bound_too_small_and_a_forward_beyond_the_plan_change_nothing():
    model = llama(torch.bfloat16).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    taken = held_now()
    with pytest.raises(ValueError, match=r"cannot hold this generation at batch 4 x 96 tokens: "
                                         r"the least that works is .*held before the offload"):
        torch_uvm.offload(model, gpu_memory=taken + (1 << 20), batch=4, seq=96)
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    assert all(t.device.type == "cpu" for t in model.state_dict().values())
    bound, _ = bound_streaming(model, "generate", 1, 64, checkpointing=False)
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=1, seq=64)
    big = torch.zeros(256, 4096, dtype=torch.long, device="cuda")
    with torch.no_grad(), pytest.raises(ValueError, match="Nothing of it ran"):
        model(big)
    with torch.no_grad():
        out = model(torch.zeros(1, 64, dtype=torch.long, device="cuda")).logits
    assert torch.isfinite(out.float()).all()
    handle.undo()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def mlp(width=2048, layers=8):
    """A module with no Hugging Face config: 8 fp32 Linears of 16 MiB."""
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks)


def train_mlp(model, handle, x, steps=3):
    """`steps` AdamW steps on a regression to a seeded target; the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if handle is not None:
        optimizer = handle.stream_optimizer(optimizer)
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).cuda()
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_module_with_no_config_stays_within_the_bound_its_inputs_plan():
    """offload(mlp, gpu_memory=..., inputs=x): planned from one forward on
    the meta device at x's shapes, its budget a third of its weights so it
    streams; the process stays within the bound while it trains, bit for
    bit as all resident, and a forward on a larger batch is refused before
    anything of it runs."""
    x = torch.randn(512, 2048, generator=torch.Generator().manual_seed(1)).cuda()
    resident = mlp().cuda()
    losses = train_mlp(resident, None, x)
    want = {n: p.detach().cpu() for n, p in resident.named_parameters()}
    del resident
    model = mlp().train()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())

    def bound_now():    # the least bound that works, with what the process holds now
        est = torch_uvm.estimate(model, task="full", budget=weights // 3, inputs=x,
                                 new_tokens=0, autocast=False, link_gbps=None,
                                 taken=held_now(), checkpointing=False)
        return least_bound(est.gpu_total + SLACK)
    bound = bound_now()
    handle = torch_uvm.offload(model, gpu_memory=bound, inputs=x)
    assert handle.state.bound.plan.task == "full" and handle.state.bound.budget < weights
    with ProcessPeak() as p:
        got = train_mlp(model, handle, x)
    p.report(bound)
    handle.undo()
    assert got == losses
    assert all(torch.equal(p.detach().cpu(), want[n]) for n, p in model.named_parameters())
    handle = torch_uvm.offload(model, gpu_memory=bound_now(), inputs=x)  # (training left cache)
    big = torch.zeros(512 * 64, 2048, device="cuda")
    with pytest.raises(ValueError, match=r"\(full fine-tune, its inputs beyond the planned ones: "
                                         r"input \[32768, 2048\] float32, planned \[512, 2048\] "
                                         r"float32\) would take .*Nothing of it ran"):
        model(big)
    handle.undo()


def test_a_gpt2_stepped_on_the_host_stays_within_its_bound():
    """GPT-2's forward saves about twice a standard layer's activations (its
    GELU is several ops), and a host step's gradients copy home beside the
    slots: the bound's plan reads the first from the forward itself, and
    stream_optimizer holds the second to the plan's gradients in flight
    (a GPT-2 1.2B under 19 GiB took 19.62 GiB before either)."""
    transformers = pytest.importorskip("transformers")
    # (16 MiB units, 786 MiB of weights: a third of them is four times the least budget)
    config = transformers.GPT2Config(n_embd=1024, n_layer=16, n_head=16, n_positions=512,
                                     vocab_size=4096, attn_pdrop=0.0, resid_pdrop=0.0,
                                     embd_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.config.use_cache = False
    bound, weights = bound_streaming(model, "full", 4, 512, checkpointing=False)
    handle = torch_uvm.offload(model, gpu_memory=bound, batch=4, seq=512)
    assert handle.state.bound.budget < weights
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4),
                                        step_in_backward=True, host_step=1.0)
    steps, budget = handle.state.host_steps, handle.state.budget
    assert steps.copies_limit(budget) == handle.state.bound.copies_room < \
        int(steps.copies_share * budget)          # (an eighth of the budget: outside the plan)
    gen = torch.Generator().manual_seed(2)
    with ProcessPeak() as p:
        for _ in range(3):
            ids = torch.randint(0, config.vocab_size, (4, 512), generator=gen).cuda()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        handle.wait_for_host_steps()
    p.report(bound)
    assert torch.isfinite(loss)
    handle.undo()
