"""An offload inside the trainers people already use, in one call each.

Hugging Face ``Trainer`` (and its subclasses: TRL's ``SFTTrainer``, ...)
makes its optimizer itself, inside ``train()``, from ``TrainingArguments``
(``optim``, ``learning_rate``, ``weight_decay`` and its no-decay groups).
``handle.stream_trainer(trainer)`` streams that optimizer as it is made:

    handle = torch_uvm.offload(model, budget="8GiB")   # before the Trainer
    trainer = Trainer(model=model, args=args, train_dataset=data)
    handle.stream_trainer(trainer)
    trainer.train()

It wraps the trainer's ``create_optimizer``, which every ``train()`` calls
before accelerate prepares the optimizer, before a checkpoint's optimizer
states are loaded (``resume_from_checkpoint``: they go to their homes) and
before the scheduler is made. An optimizer the trainer already holds
(``optimizers=(optimizer, None)``) is streamed at once.

Accelerate's ``Accelerator`` and Lightning take the optimizer the user
makes: ``handle.stream_optimizer(optimizer)`` before ``prepare`` (or in
``configure_optimizers``) is their one call (docs/training.md).

Everything the trainer's settings make impossible is refused here, before
anything changes, rather than in the middle of a backward."""
from __future__ import annotations

import types

import torch

#: Set on a trainer whose optimizer an offload streams (one offload each).
MARK = "_torch_uvm_streamed_by"


def check(handle, trainer, step_in_backward: bool) -> None:
    """Refuses a trainer `handle` cannot stream: naming the setting and what
    to do instead."""
    model, args = getattr(trainer, "model", None), getattr(trainer, "args", None)
    if model is None or args is None or not callable(getattr(trainer, "create_optimizer", None)):
        raise TypeError(f"torch_uvm: stream_trainer takes a Hugging Face transformers.Trainer "
                        f"(or a subclass), got {type(trainer).__name__}; for another loop use "
                        f"stream_optimizer(optimizer)")
    if getattr(trainer, MARK, None) is not None:
        raise ValueError("torch_uvm: this trainer's optimizer is streamed by an offload already "
                         "(stream_trainer was called for it before)")
    if not any(m is handle.module for m in model.modules()):
        raise ValueError(f"torch_uvm: the trainer trains {type(model).__name__}, which is not "
                         f"and does not hold the offloaded {type(handle.module).__name__}: "
                         f"offload the model you give the Trainer, before making the Trainer")
    for setting in ("deepspeed", "fsdp"):   # (from the arguments or accelerate's launcher)
        if getattr(args, setting, None) or getattr(trainer, f"is_{setting}_enabled", False):
            raise ValueError(f"torch_uvm: TrainingArguments.{setting} is set: it shards and "
                             f"offloads the model itself. Use it or torch_uvm, not both")
    if getattr(args, "n_gpu", 1) > 1:
        raise ValueError(f"torch_uvm: the Trainer sees {args.n_gpu} GPUs and would wrap the "
                         f"offloaded model in nn.DataParallel. Run one process per GPU "
                         f"(torchrun), or show it one (CUDA_VISIBLE_DEVICES)")
    if getattr(trainer, "model_init", None) is not None:
        raise ValueError("torch_uvm: the Trainer has a model_init: each train() would make "
                         "a new model, not the offloaded one. Offload the model and give it "
                         "as Trainer(model=...)")
    optim = str(getattr(args, "optim", ""))
    if "layerwise" in optim or "lomo" in optim:
        raise ValueError(f"torch_uvm: optim={optim!r} steps inside gradient hooks, outside "
                         f"the optimizer's step, which is what torch_uvm streams. Choose "
                         f"another optim (adamw_torch_fused, say)")
    if trainer.optimizer is not None and unwrapped(trainer.optimizer) is not trainer.optimizer:
        raise ValueError("torch_uvm: the Trainer has trained already and accelerate holds its "
                         "optimizer's step: call stream_trainer before the first train()")
    if step_in_backward:
        if getattr(args, "fp16", False):
            raise ValueError(
                "torch_uvm: stream_trainer(step_in_backward=True) with fp16=True: each "
                "submodule would step in backward on gradients the loss scaler has scaled, "
                "before it checks them. Use bf16=True, or step_in_backward=False")
        if args.max_grad_norm:
            raise ValueError(
                f"torch_uvm: stream_trainer(step_in_backward=True) with max_grad_norm="
                f"{args.max_grad_norm}: the Trainer clips the gradients by their global norm "
                f"after backward, and with step_in_backward they have stepped and are gone. "
                f"Set TrainingArguments(max_grad_norm=0) to step in backward, or keep clipping "
                f"without step_in_backward")
        if args.gradient_accumulation_steps > 1:
            raise ValueError(
                f"torch_uvm: stream_trainer(step_in_backward=True) with "
                f"gradient_accumulation_steps={args.gradient_accumulation_steps}: a step in "
                f"backward cannot add up several backwards' gradients. Use step_in_backward="
                f"False to accumulate")


def unwrapped(optimizer):
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (a
    trainer holds that after its first ``train()``), or `optimizer`."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def stream_trainer(handle, trainer, **stream: object):
    """Makes `trainer` stream its optimizer through `handle`
    (``stream_optimizer(optimizer, **stream)``); returns `trainer`."""
    check(handle, trainer, bool(stream.get("step_in_backward")))
    made = trainer.create_optimizer          # bound: a subclass's own, if it has one

    def create_optimizer(self, *args, **kwargs):
        optimizer = made(*args, **kwargs)
        inner = unwrapped(optimizer)        # a later train(): accelerate's wrapper of it
        if not handle.streams(inner):       # (each train() calls it; streamed once)
            handle.stream_optimizer(inner, **stream)
        return optimizer
    given = trainer.optimizer               # given to the Trainer: streamed now (once)
    if given is not None and not handle.streams(given):
        handle.stream_optimizer(given, **stream)
    trainer.create_optimizer = types.MethodType(create_optimizer, trainer)
    setattr(trainer, MARK, handle)
    return trainer
