"""The whole process's GPU memory, bounded: offload's ``gpu_memory``.

    torch_uvm.offload(model, gpu_memory="20GiB", batch=4, seq=1024)

Before anything is pinned, offload measures what the process holds on the
GPU already (``torch.cuda.mem_get_info``: its CUDA context, any tensors),
and estimate.py sizes the rest of a training step or a generation of the
model at that batch and sequence: the slots, the gradients in flight, the
activations, the logits, the KV cache, the allocator's cache and the
workspaces. The budget is the largest that keeps the whole within
``gpu_memory``. Training without activation checkpointing sends its saved
activations home (offload_activations) when that is the only way to fit.
When nothing fits, offload refuses, naming the least that would fit and
what takes it, and nothing has changed.

Each forward of the module is checked before anything of it runs: one on a
larger batch or a longer sequence than planned (a generation's prompt and
the tokens made so far) is estimated again, and refused when it would pass
the bound.

The bound holds as far as the estimate does: decoder-only transformers
with a Hugging Face config (docs/estimate.md gives its accuracy against
every committed run). The task is read from the module when it is
offloaded: in train() with every parameter requiring grad, a full
fine-tune; with some, a LoRA fine-tune (the trainable ones measured); else
generation. A forward without grad is checked as a generation."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .activations import offload_activations
from .estimate import WORDS, Estimate, estimate, size_text
from .sizes import card_bytes


def task_of(module: torch.nn.Module) -> str:
    """"full", "lora" or "generate": what the estimate sizes for `module` now."""
    floats = [p for p in module.parameters() if p.is_floating_point()]
    trainable = sum(p.requires_grad for p in floats)
    if not module.training or trainable == 0:
        return "generate"
    return "full" if trainable == len(floats) else "lora"


def tokens_of(args, kwargs) -> Optional[Tuple[int, int]]:
    """(batch, tokens a sequence) of a language model's forward: its
    ``input_ids`` (or ``inputs_embeds``, or first argument), and the tokens
    its cache (``past_key_values``, or ``cache`` in later transformers)
    holds already; None for another call."""
    x = kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
    if x is None and args and isinstance(args[0], torch.Tensor):
        x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return None
    past = kwargs.get("past_key_values", kwargs.get("cache"))
    held = past.get_seq_length() if hasattr(past, "get_seq_length") else 0
    return int(x.shape[0]), int(x.shape[1]) + int(held)


class ProcessBound:
    """An offload's bound on its process's GPU memory: the plan it chose
    (`plan`: the estimate at the batch and sequence offload was given) and
    the check of each forward against it."""

    def __init__(self, module: torch.nn.Module, limit: int, taken: int, plan: Estimate,
                 options: dict):
        self.module, self.limit, self.taken, self.plan = module, limit, taken, plan
        self.options = options     # estimate's arguments beside task, batch and seq
        self._fits: Dict[Tuple[str, int, int], Estimate] = {}
        self._activations = offload_activations() if plan.activations_home else None
        self._entered = False
        self._depth = 0            # forwards of the module begun and not ended (nested ones)

    @classmethod
    def plan_for(cls, module: torch.nn.Module, gpu_memory, device: torch.device, batch,
                 seq, ahead: int, units) -> "ProcessBound":
        """The bound `gpu_memory` (sizes.card_bytes) for `module` running
        `batch` sequences of `seq` tokens on `device`, or ValueError naming
        what was wrong (before anything is pinned)."""
        limit = card_bytes(gpu_memory, "gpu_memory", device)
        for name, v in (("batch", batch), ("seq", seq)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"torch_uvm: offload's gpu_memory sizes a step or a generation at the "
                    f"largest batch and sequence (prompt and generated tokens) its forwards "
                    f"will run: pass {name}= as a positive int, got {v!r}")
        if not hasattr(getattr(module, "config", None), "to_dict"):
            raise ValueError("torch_uvm: offload's gpu_memory sizes the activations from a "
                             "Hugging Face model's config (module.config), and this module has "
                             "none: pass budget= instead (estimate a similar config with "
                             "torch_uvm.estimate to choose it)")
        torch.cuda.synchronize(device)     # (what PyTorch's allocator caches unused is
        torch.cuda.empty_cache()           #  given back first: the estimate counts its own)
        free, total = torch.cuda.mem_get_info(device)
        taken = total - free
        task = task_of(module)
        checkpointing = bool(getattr(module, "is_activation_checkpointing",   # (transformers'
                                 getattr(module, "is_gradient_checkpointing", False)))  # old name)
        options = dict(checkpointing=checkpointing, ahead=ahead,
                       units="submodules" if units is None else units, autocast=False,
                       new_tokens=0, link_gbps=None, taken=taken,
                       # (a checkpointed layer's input is held by checkpoint itself,
                       # out of offload_activations' reach)
                       activations_home=False if checkpointing else "auto")
        plan = estimate(module, task=task, gpu_memory=limit, batch=batch, seq=seq, **options)
        options["activations_home"] = plan.activations_home
        return cls(module, limit, taken, plan, options)

    @property
    def budget(self) -> int:
        return self.plan.budget

    def _estimate(self, task: str, batch: int, seq: int) -> Estimate:
        key = (task, batch, seq)
        found = self._fits.get(key)
        if found is None:
            found = estimate(self.module, task=task, budget=self.plan.budget, batch=batch,
                             seq=seq, **self.options)
            if len(self._fits) > 64:
                self._fits.clear()
            self._fits[key] = found
        return found

    def check(self, args, kwargs) -> None:
        """Before a forward of the module: refuse one that would pass the
        bound (ValueError, nothing of it run). Within the planned batch and
        sequence, a forward of the planned task passes unestimated."""
        shape = tokens_of(args, kwargs)
        if shape is None:
            return
        batch, seq = shape
        task = self.plan.task if torch.is_grad_enabled() else "generate"
        if task == self.plan.task and batch <= self.plan.batch and seq <= self.plan.seq:
            return
        found = self._estimate(task, batch, seq)   # (beyond the plan: once a shape)
        if found.gpu_total > self.limit:
            parts = ", ".join(f"{k} {size_text(v)}" for k, v in found.gpu.items())
            raise ValueError(
                f"torch_uvm: this forward ({WORDS[task]}, batch {batch} x {seq} tokens) would "
                f"take about {size_text(found.gpu_total)} of GPU memory, above the offload's "
                f"gpu_memory of {size_text(self.limit)}, planned for batch {self.plan.batch} x "
                f"{self.plan.seq} ({parts}). Nothing of it ran: lower the batch or the "
                f"sequence, or offload again with the batch= and seq= it needs")

    def begin_forward(self) -> None:
        """Saved activations go home from here to the outermost forward's
        end, when the plan chose so and that forward builds a graph."""
        self._depth += 1
        if self._depth == 1 and self._activations is not None and torch.is_grad_enabled():
            self._activations.__enter__()
            self._entered = True

    def end_forward(self) -> None:
        """After each forward, an exception's included (a forward its check
        refused never began: it ends nothing)."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._entered:
            self._entered = False
            self._activations.__exit__(None, None, None)

    def describe(self) -> str:
        """One line: the bound, what the process held when it was planned,
        and the budget chosen."""
        return (f"gpu_memory {size_text(self.limit)} ({WORDS[self.plan.task]}, batch "
                f"{self.plan.batch} x {self.plan.seq}; {size_text(self.taken)} held before): "
                f"budget {size_text(self.plan.budget)}"
                f"{', saved activations home' if self.plan.activations_home else ''}")
