"""PEFT LoRA on a tiny GPT-2 (50 MiB of frozen weights, rank-16 adapters
on every attention and MLP projection) within 16 MiB of the GPU, with a
learning-rate schedule.

``get_peft_model`` freezes the base; the whole PEFT model is offloaded and
the optimizer made over its trainable parameters. Each LoRA layer (a base
weight and its two adapters) streams as one unit (``units=[LoraLayer]``):
the next base weight comes with its adapters, while this one computes.
Frozen weights need no room for gradients or optimizer states, so the
budget is below what training every weight would need (5 x 4 MiB): it
holds the window of two MLP LoRA layers (2 x 4 MiB and their adapters) and
an adapter's gradients and states. The scheduler wraps the streamed
optimizer's ``step``.

    python examples/training/peft_lora.py
"""
import _common
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

import torch_uvm

MiB = _common.MiB
BUDGET = 16 * MiB
VOCAB, SEQ, STEPS, BATCH = 1024, 32, 8, 4


def train(offload: bool) -> dict:
    _common.start()
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=512, n_layer=4, n_head=8,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, fan_in_fan_out=True,
                      target_modules=["c_attn", "c_proj", "c_fc"], task_type="CAUSAL_LM")
    model = get_peft_model(GPT2LMHeadModel(config), lora)
    if offload:
        handle = torch_uvm.offload(model, budget=BUDGET, units=[LoraLayer])
    else:
        handle = None
        model.cuda()
    # after the offload: it replaces the parameters
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                                  fused=True)
    if handle is not None:
        optimizer = handle.stream_optimizer(optimizer)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=2,
                                                num_training_steps=STEPS)
    tokens = torch.randint(VOCAB, (STEPS, BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    losses = []
    for ids in tokens.cuda():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return _common.finish(losses, {"model": model}, [optimizer], [handle], BUDGET)


if __name__ == "__main__":
    _common.main(train)
