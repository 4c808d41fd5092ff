"""Hugging Face ``transformers.Trainer`` training a tiny GPT-2 (4 layers of
width 512, 50 MiB of weights) within 24 MiB of the GPU, on random tokens.

The model is offloaded before the Trainer is made, and one call,
``handle.stream_trainer(trainer)``, streams the optimizer the Trainer makes
from its arguments (fused AdamW, weight decay but on biases and norms, a
cosine schedule): the Trainer wraps it in accelerate's
``AcceleratedOptimizer``, adds its learning-rate scheduler, and clips
gradients by their global norm (``max_grad_norm``, 1.0 by default) before
each step, which the default ``step_in_backward=False`` allows. Eager
attention: SDPA's backward accumulates with atomics, so its losses would
differ from run to run in the last digits.

    python examples/training/hf_trainer.py

On a machine of several GPUs, show it one (``CUDA_VISIBLE_DEVICES=0``): a
Trainer that sees two wraps the model in ``nn.DataParallel``, which
``stream_trainer`` refuses, naming this way out and torchrun's.
"""
import tempfile

import _common
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import torch_uvm

MiB = _common.MiB
# The largest submodules are the MLPs' Conv1D(512, 2048), 4 MiB: training
# streams two of them and one's gradients and two AdamW states (5 x 4 MiB).
BUDGET = 24 * MiB
VOCAB, SEQ, STEPS, BATCH = 1024, 32, 8, 2


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.ids = torch.randint(VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(offload: bool) -> dict:
    _common.start()
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=512, n_layer=4, n_head=8,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    if offload:
        handle = torch_uvm.offload(model, budget=BUDGET)     # before the Trainer
    else:
        handle = None
        model.cuda()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=STEPS, per_device_train_batch_size=BATCH,
                                 optim="adamw_torch_fused", learning_rate=3e-4, weight_decay=0.01,
                                 lr_scheduler_type="cosine", warmup_steps=2, logging_steps=1,
                                 save_strategy="no", report_to=[], dataloader_num_workers=0,
                                 seed=_common.SEED, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(STEPS * BATCH))
        if offload:
            handle.stream_trainer(trainer)     # the optimizer the Trainer makes
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)   # (accelerate's wrapper)
    return _common.finish(losses, {"model": model}, [optimizer], [handle], BUDGET)


if __name__ == "__main__":
    _common.main(train)
