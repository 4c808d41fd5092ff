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

A module with no Hugging Face config (an MLP, a vision model) is planned
from ``inputs``, its forward's arguments at the largest shapes it will run:
estimate reads its activations from one forward on the meta device
(estimate_trace.py). A later forward whose tensors are each within those
shapes, dimension by dimension, passes; a larger one is estimated again
from its own shapes, on the meta device, and refused if it would pass.

The bound holds as far as the estimate does: decoder-only transformers
with a Hugging Face config, and modules traced from their inputs
(docs/estimate.md gives its accuracy against every committed run, and
where it misses). The task is read from the module when it is
offloaded: in train() with every parameter requiring grad, a full
fine-tune; with some, a LoRA fine-tune (the trainable ones measured); else
generation. A forward without grad is checked as a generation."""
from __future__ import annotations

import inspect
from typing import Dict, Optional, Tuple

import torch
from torch.utils._pytree import tree_leaves

from .activations import offload_activations
from .estimate import IN_FLIGHT, WORDS, Estimate, estimate, size_text
from .estimate_trace import Call, TraceFailed, call_of, match_modes, meta_inputs, meta_twin
from .offload_state import STEPS_BEHIND
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


def argument_shapes(forward, args, kwargs) -> Optional[Dict[str, tuple]]:
    """A call's arguments by the names `forward` gives them, each as its
    leaves in order: a tensor's (shape, dtype), any other value's
    ("value", it) (its type's name where it cannot be hashed); None when
    they do not bind."""
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()      # (a number left at its default is the plan's too)
    return {name: tuple(_leaf(x) for x in tree_leaves(value) if x is not None)
            for name, value in bound.arguments.items()}


def _leaf(x) -> tuple:
    if isinstance(x, torch.Tensor):
        return tuple(x.shape), x.dtype
    try:
        hash(x)
    except TypeError:
        return "value", type(x).__name__
    return "value", x


def beyond(call: Dict[str, tuple], planned: Dict[str, tuple]) -> Optional[str]:
    """None when each tensor of a call is at most the planned one in its
    place, dimension by dimension, in a dtype no wider, and every other
    value is the planned one (an argument that holds nothing, left out or
    None, is within); else the first that is not, named."""
    for name, leaves in call.items():
        want = planned.get(name)
        if not leaves:
            continue
        if want is None or len(leaves) != len(want):
            return f"{name} (not as the planned inputs hold it)"
        for got, most in zip(leaves, want):
            if got[0] == "value" or most[0] == "value":
                if got != most:
                    return f"{name}: {got[1]!r}, planned {most[1]!r}"
                continue
            (shape, dtype), (top, top_dtype) = got, most
            if len(shape) != len(top) or any(a > b for a, b in zip(shape, top)) or \
                    dtype.itemsize > top_dtype.itemsize:
                return (f"{name} {list(shape)} {str(dtype).replace('torch.', '')}, planned "
                        f"{list(top)} {str(top_dtype).replace('torch.', '')}")
    return None


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
                 options: dict, inputs=None):
        self.module, self.limit, self.taken, self.plan = module, limit, taken, plan
        # a traced plan's inputs, as meta tensors, and their shapes by argument
        self.inputs = None if inputs is None else meta_inputs(inputs)
        self.planned = None if inputs is None else argument_shapes(module.forward,
                                                                   *call_of(inputs))
        # what a later forward's estimate traces: the module itself, offloaded
        # and hooked by then, would run the offload's hooks and this check
        self.twin, self._no_twin = None, None
        if inputs is not None:
            try:
                self.twin = meta_twin(module)
            except Exception as err:      # (something in it that cannot be copied)
                self._no_twin = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        self.options = options     # estimate's arguments beside task, batch and seq
        self.margin = plan.gpu.get("margin", 0)   # kept free for the estimate's error
        self._fits: Dict[tuple, Estimate] = {}    # (task, shapes) to its estimate
        self._activations = offload_activations() if plan.activations_home else None
        self._entered = False
        self._depth = 0            # forwards of the module begun and not ended (nested ones)
        self._refused = 0          # forwards its check refused, whose ends are still to come

    @classmethod
    def plan_for(cls, module: torch.nn.Module, gpu_memory, device: torch.device, batch,
                 seq, ahead: int, units, inputs=None) -> "ProcessBound":
        """The bound `gpu_memory` (sizes.card_bytes) for `module` running
        `batch` sequences of `seq` tokens on `device` (a Hugging Face
        model), or its forward on `inputs` (any other module), or
        ValueError naming what was wrong (before anything is pinned)."""
        hf = hasattr(getattr(module, "config", None), "to_dict")
        if inputs is not None:
            if hf:
                raise ValueError("torch_uvm: offload's inputs= plan a module with no Hugging "
                                 "Face config; this one has one (its KV cache, checkpointing and "
                                 "attention come from it): pass batch= and seq= instead")
            if batch is not None or seq is not None:
                raise ValueError("torch_uvm: offload's inputs= give the forward's largest "
                                 "shapes; batch= and seq= are for a Hugging Face model: pass "
                                 "one or the other")
        elif not hf:
            raise ValueError("torch_uvm: offload's gpu_memory sizes the activations of a module "
                             "with no Hugging Face config (module.config) from one forward on "
                             "the meta device: pass inputs=, its forward's arguments at the "
                             "largest shapes it will run (tensors on any device: only their "
                             "shapes are read), or budget= instead")
        else:
            for name, v in (("batch", batch), ("seq", seq)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(
                        f"torch_uvm: offload's gpu_memory sizes a step or a generation at the "
                        f"largest batch and sequence (prompt and generated tokens) its "
                        f"forwards will run: pass {name}= as a positive int, got {v!r}")
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
        shapes = dict(inputs=inputs) if inputs is not None else dict(batch=batch, seq=seq)
        try:
            plan = estimate(module, task=task, gpu_memory=limit, **shapes, **options)
        except ValueError as err:    # (offload sends no checkpointed layer's input home)
            raise ValueError(str(err).replace(", or send activations home", "")) from None
        options["activations_home"] = plan.activations_home
        return cls(module, limit, taken, plan, options, inputs)

    @property
    def budget(self) -> int:
        return self.plan.budget

    @property
    def copies_room(self) -> int:
        """The bytes of a host step's gradients that may be copying home at
        once within the bound: of the plan's gradients in flight, those of
        STEPS_BEHIND submodules beside the one being made (estimate.IN_FLIGHT)."""
        return self.plan.gpu.get("gradients in flight", 0) * STEPS_BEHIND // IN_FLIGHT

    def _estimate(self, task: str, key, **shapes) -> Estimate:
        """The estimate of `task` at `shapes` (batch= and seq=, or inputs=,
        traced on the twin), once a `key`."""
        key = (task, key)
        found = self._fits.get(key)
        if found is None:
            module = self.module
            if "inputs" in shapes:        # (the twin, in the module's modes now)
                match_modes(self.twin, self.module)
                module = self.twin
            found = estimate(module, task=task, budget=self.plan.budget, **shapes,
                             **self.options)
            if len(self._fits) > 64:
                self._fits.clear()
            self._fits[key] = found
        return found

    def check(self, args, kwargs) -> None:
        """Before a forward of the module: refuse one that would pass the
        bound (ValueError, nothing of it run). Within the planned batch and
        sequence (or inputs' shapes), a forward of the planned task passes
        unestimated."""
        # (a training forward: the task the module is in now, which may not be
        # the plan's: a model offloaded in eval() and then trained)
        task = task_of(self.module) if torch.is_grad_enabled() else "generate"
        if self.planned is not None:
            shapes = argument_shapes(self.module.forward, args, kwargs)
            if shapes is None:
                return        # (arguments the forward does not take: it raises itself)
            over = beyond(shapes, self.planned)
            try:
                found = self._traced(task, args, kwargs, shapes, over)
            except ValueError:
                self._refused += 1     # (refused as below: its end ends nothing)
                raise
            if found is None:
                return
            what, planned, again = (
                f"its inputs beyond the planned ones: {over}" if over else "its inputs",
                "its inputs", "give smaller inputs, or undo() and offload again with the "
                "inputs= it needs")
        else:
            shape = tokens_of(args, kwargs)
            if shape is None:
                return
            batch, seq = shape
            if batch <= self.plan.batch and seq <= self.plan.seq:
                if task == self.plan.task:
                    return
                planned_shape = dict(batch=self.plan.batch, seq=self.plan.seq)
                if self._estimate(task, tuple(planned_shape.values()), **planned_shape) \
                        .gpu_total + self.margin <= self.limit:
                    return   # (the planned shape fits this task too: so does a smaller one)
            found = self._estimate(task, (batch, seq), batch=batch, seq=seq)   # (once a shape)
            what, planned, again = (
                f"batch {batch} x {seq} tokens", f"batch {self.plan.batch} x {self.plan.seq}",
                "lower the batch or the sequence, or undo() and offload again with the batch= "
                "and seq= it needs")
        if found.gpu_total + self.margin > self.limit:
            self._refused += 1     # (its end is still called: it ends nothing)
            parts = ", ".join(f"{k} {size_text(v)}" for k, v in found.gpu.items())
            raise ValueError(
                f"torch_uvm: this forward ({WORDS[task]}, {what}) would take about "
                f"{size_text(found.gpu_total + self.margin)} of GPU memory (a margin of "
                f"{size_text(self.margin)} for the estimate's error in it), above the offload's "
                f"gpu_memory of {size_text(self.limit)}, planned for {planned} as a "
                f"{WORDS[self.plan.task]} ({parts}). Nothing of it ran: {again} (in train() for "
                f"training)")

    def _traced(self, task: str, args, kwargs, shapes, over) -> Optional[Estimate]:
        """A traced plan's estimate of this call, or None when it passes:
        within the planned inputs (`over` None) in the planned task, or in
        another that the planned inputs fit too. Else the call is traced at
        its own shapes, once a shape; one its trace fails on is left to the
        forward (it raises its own error there)."""
        if over is None and task == self.plan.task:
            return None
        if self.twin is None:
            which = "beyond its planned inputs" if over else "of another task"
            raise ValueError(
                f"torch_uvm: this module could not be copied to the meta device ("
                f"{self._no_twin}), so a forward {which} cannot be estimated against "
                f"gpu_memory: offload it again with inputs= at the largest shapes it will run, "
                f"in the mode it will run in")
        if over is None:
            found = self._estimate(task, "planned", inputs=self.inputs)
            if found.gpu_total + self.margin <= self.limit:
                return None   # (the planned inputs fit this task too: so does a smaller call)
        try:
            return self._estimate(task, tuple(shapes.items()),
                                  inputs=Call(tuple(args), dict(kwargs)))
        except TraceFailed:
            return None

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
