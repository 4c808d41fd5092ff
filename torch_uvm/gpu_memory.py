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
    """(batch, tokens a sequence) of a language model's forward, read from
    shapes alone (no value on the GPU, so no wait for it): its
    ``input_ids`` (or ``inputs_embeds``, or first argument) and the tokens
    before them, which its 2-D ``attention_mask`` covers with them, or else
    its cache (``past_key_values``, or ``cache`` in later transformers)
    holds; a static cache that has run counts its whole length, its memory
    taken anyway. None for another call."""
    x = kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
    if x is None and args and isinstance(args[0], torch.Tensor):
        x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return None
    batch, new = int(x.shape[0]), int(x.shape[1])
    held, sized = _cache_tokens(kwargs.get("past_key_values", kwargs.get("cache")))
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] >= new:
        return batch, max(int(mask.shape[1]), sized)
    return batch, max(new + held, sized)


def _cache_tokens(past) -> Tuple[int, int]:
    """(the tokens a cache holds, where its shapes say so; the tokens its
    memory is sized for, a static cache's length, else 0)."""
    if isinstance(past, (tuple, list)):        # ((keys, values), ...) a layer: [b, heads, t, d]
        try:
            return int(past[0][0].shape[-2]), 0
        except (IndexError, AttributeError, TypeError):
            return 0, 0
    if not hasattr(past, "get_seq_length"):
        return 0, 0
    held = past.get_seq_length()
    if not isinstance(held, torch.Tensor):
        return int(held), 0
    # (a static cache counts on the GPU: its length instead, or the count where it has none)
    try:
        longest = past.get_max_length()
    except (AttributeError, ValueError, TypeError):
        longest = None
    if isinstance(longest, int) and longest > 0:
        return 0, longest
    return int(held), 0


class ProcessBound:
    """An offload's bound on its process's GPU memory: the plan it chose
    (`plan`: the estimate at the batch and sequence offload was given) and
    the check of each forward against it."""

    def __init__(self, module: torch.nn.Module, limit: int, taken: int, plan: Estimate,
                 options: dict):
        self.module, self.limit, self.taken, self.plan = module, limit, taken, plan
        self.options = options     # estimate's arguments beside task, batch and seq
        self.margin = plan.gpu.get("margin", 0)   # kept free for the estimate's error
        self._fits: Dict[Tuple[str, int, int], Estimate] = {}
        self._activations = offload_activations() if plan.activations_home else None
        self._entered = False
        self._depth = 0            # forwards of the module begun and not ended (nested ones)
        self._refused = 0          # forwards its check refused, whose ends are still to come

    @classmethod
    def plan_for(cls, module: torch.nn.Module, gpu_memory, device: torch.device, batch,
                 seq, ahead: int, units) -> "ProcessBound":
        """The bound `gpu_memory` (sizes.card_bytes) for `module` running
        `batch` sequences of `seq` tokens on `device`, or ValueError naming
        what was wrong (before anything is pinned)."""
        for name, v in (("batch", batch), ("seq", seq)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"torch_uvm: offload's gpu_memory sizes a step or a generation at the "
                    f"largest batch and sequence (prompt and generated tokens) its forwards "
                    f"will run: pass {name}= as a positive int, got {v!r}")
        if not hasattr(getattr(module, "config", None), "to_dict"):
            raise ValueError("torch_uvm: offload's gpu_memory sizes the activations from a "
                             "Hugging Face model's config (module.config), and this module has "
                             "none: pass budget= instead (torch_uvm.estimate(module, task=..., "
                             "inputs=...) says what a budget takes, from one forward on the meta "
                             "device)")
        limit = card_bytes(gpu_memory, "gpu_memory", device)
        torch.cuda.synchronize(device)     # (what PyTorch's allocator caches unused is
        torch.cuda.empty_cache()           #  given back first: the estimate counts its own)
        free, total = torch.cuda.mem_get_info(device)
        # (the module's own tensors on this GPU leave it as they move into their
        # homes: the estimate counts them again as slots)
        own = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
               for t in list(module.parameters()) + list(module.buffers())
               if t.device == device}
        taken = max(0, total - free - sum(own.values()))
        task = task_of(module)
        checkpointing = bool(getattr(module, "is_activation_checkpointing",   # (transformers'
                                 getattr(module, "is_gradient_checkpointing", False)))  # old name)
        options = dict(checkpointing=checkpointing, ahead=ahead,
                       units="submodules" if units is None else units, autocast=False,
                       new_tokens=0, link_gbps=None, taken=taken,
                       # (a checkpointed layer's input is held by checkpoint itself,
                       # out of offload_activations' reach)
                       activations_home=False if checkpointing else "auto")
        try:
            plan = estimate(module, task=task, gpu_memory=limit, batch=batch, seq=seq, **options)
        except ValueError as err:    # (offload sends no checkpointed layer's input home)
            raise ValueError(str(err).replace(", or send activations home", "")) from None
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
        # (a training forward: the task the module is in now, which may not be
        # the plan's: a model offloaded in eval() and then trained)
        task = task_of(self.module) if torch.is_grad_enabled() else "generate"
        if batch <= self.plan.batch and seq <= self.plan.seq:
            if task == self.plan.task:
                return
            if self._estimate(task, self.plan.batch, self.plan.seq).gpu_total + self.margin \
                    <= self.limit:
                return      # (the planned shape fits this task too: so does a smaller one)
        found = self._estimate(task, batch, seq)   # (beyond the plan: once a shape)
        if found.gpu_total + self.margin > self.limit:
            self._refused += 1     # (its end is still called: it ends nothing)
            parts = ", ".join(f"{k} {size_text(v)}" for k, v in found.gpu.items())
            raise ValueError(
                f"torch_uvm: this forward ({WORDS[task]}, batch {batch} x {seq} tokens) would "
                f"take about {size_text(found.gpu_total + self.margin)} of GPU memory (a margin "
                f"of {size_text(self.margin)} for the estimate's error in it), above the offload's "
                f"gpu_memory of {size_text(self.limit)}, planned for batch {self.plan.batch} x "
                f"{self.plan.seq} as a {WORDS[self.plan.task]} ({parts}). Nothing of it ran: "
                f"lower the batch or the sequence, or undo() and offload again with the "
                f"batch= and seq= it needs (in train() for training)")

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
        if self._refused:
            self._refused -= 1
            return
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._entered:
            self._entered = False
            self._activations.__exit__(None, None, None)

    def close(self) -> None:
        """At undo(): leaves the activations' context if a forward left it
        entered (one interrupted by a KeyboardInterrupt, which forward hooks
        that always run do not see)."""
        self._depth = self._refused = 0
        if self._entered:
            self._entered = False
            self._activations.__exit__(None, None, None)

    def describe(self) -> str:
        """One line: the bound, what the process held when it was planned,
        and the budget chosen."""
        return (f"gpu_memory {size_text(self.limit)} ({WORDS[self.plan.task]}, batch "
                f"{self.plan.batch} x {self.plan.seq}; {size_text(self.taken)} held before): "
                f"budget {size_text(self.plan.budget)}"
                f"{', saved activations home' if self.plan.activations_home else ''}")
