"""What the examples in this folder share: the seeds, what ``train()``
returns, and the check that an offloaded run equals an all-resident one.

Each example's ``train(offload)`` runs the same training twice over: with
``offload=False`` the model is simply ``.cuda()`` and the optimizer a plain
one; with ``offload=True`` torch_uvm streams the model within a budget. It
starts with :func:`start` and returns :func:`finish`'s dict:

- ``losses``: every loss computed (training, and evaluation where the
  example evaluates), as floats, in order;
- ``weights``: ``{name: CPU copy}`` of the parameters and buffers after
  training (after ``undo()`` when offloaded);
- ``share_peak``: the largest ``residency_stats()["resident_bytes.peak"]``
  of the run's offloads (torch_uvm's books); None all resident;
- ``budget``: the budgets of the offloads held at once, added up; None all
  resident;
- ``gpu_peak``: ``torch.cuda.max_memory_allocated()`` over the run
  (PyTorch's own measure, apart from torch_uvm's books);
- ``model_state_bytes``: the weights, gradients and optimizer states, all
  resident; None offloaded.
"""
from __future__ import annotations

import gc
import os
import random
import sys
from typing import Dict, Iterable, Optional

# cuBLAS picks its reduction order by workspace: a fixed configuration makes
# GEMMs deterministic. It is read when cuBLAS starts: before any GEMM.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

MiB = 1 << 20
SEED = 0


def start(seed: int = SEED) -> None:
    """First thing in ``train()``: the same seeds and deterministic kernels in
    both runs, and the GPU's peak counted from here."""
    torch.use_deterministic_algorithms(True)
    random.seed(seed)
    torch.manual_seed(seed)           # the CPU's generator and every GPU's
    gc.collect()                      # an earlier run's model, held by a reference cycle
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def undo(handle) -> int:
    """``handle.undo()``; returns the peak of the offload's share, read before
    the undo gives the share back."""
    torch.cuda.synchronize()
    peak = handle.residency_stats()["resident_bytes.peak"]
    handle.undo()
    return peak


def weights(modules: Dict[str, torch.nn.Module]) -> Dict[str, torch.Tensor]:
    """A CPU copy of every parameter and buffer, by name."""
    return {f"{prefix}.{name}" if prefix else name: t.detach().cpu().clone()
            for prefix, module in modules.items() for name, t in module.state_dict().items()}


def state_bytes(modules: Dict[str, torch.nn.Module], optimizers: Iterable) -> int:
    """The weights, and for each parameter an optimizer stepped its gradient
    and states: what training holds on the GPU all resident."""
    tensors = {id(t): t for m in modules.values()
               for t in list(m.parameters()) + list(m.buffers())}
    total = sum(t.nbytes for t in tensors.values())
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p)
                if state:
                    total += p.nbytes + sum(t.nbytes for t in state.values()
                                            if isinstance(t, torch.Tensor))
    return total


def finish(losses, modules: Dict[str, torch.nn.Module], optimizers: Iterable = (),
           handles: Iterable = (), budget: Optional[int] = None, peaks: Iterable[int] = ()) -> dict:
    """Last thing in ``train()``: reads the figures, undoes the offloads in
    `handles` (None for all resident), and collects the weights. `peaks`:
    those of offloads the run undid earlier (:func:`undo`)."""
    torch.cuda.synchronize()
    gpu_peak = torch.cuda.max_memory_allocated()
    peaks = list(peaks) + [undo(h) for h in handles if h is not None]
    offloaded = bool(peaks)
    return {
        "losses": [float(loss) for loss in losses],
        "weights": weights(modules),
        "share_peak": max(peaks) if offloaded else None,
        "budget": budget if offloaded else None,
        "gpu_peak": gpu_peak,
        "model_state_bytes": None if offloaded else state_bytes(modules, optimizers),
    }


def compare(resident: dict, offloaded: dict) -> dict:
    """The two runs side by side, as JSON: the losses, whether they and every
    weight are equal bit for bit (the first names that differ), and the
    memory figures."""
    a, b = resident["weights"], offloaded["weights"]
    differ = [name for name in sorted(set(a) | set(b))
              if name not in a or name not in b or not torch.equal(a[name], b[name])]
    return {
        "losses": [resident["losses"], offloaded["losses"]],
        "losses_equal": resident["losses"] == offloaded["losses"],
        "weights": len(a),
        "weights_differ": differ[:5],
        "share_peak": offloaded["share_peak"],
        "budget": offloaded["budget"],
        "gpu_peak": [resident["gpu_peak"], offloaded["gpu_peak"]],
        "model_state_bytes": resident["model_state_bytes"],
    }


def main(train) -> None:
    """``python example.py``: trains all resident, then offloaded, checks
    that the losses and weights are equal bit for bit, and says so in one
    line."""
    c = compare(train(False), train(True))
    resident_peak, offloaded_peak = c["gpu_peak"]
    print(f"{len(c['losses'][0])} losses and {c['weights']} weights "
          f"{'bit-identical' if c['losses_equal'] and not c['weights_differ'] else 'DIFFER'}; "
          f"offloaded: share peak {c['share_peak'] / MiB:.0f} MiB of a "
          f"{c['budget'] / MiB:.0f} MiB budget, GPU peak {offloaded_peak / MiB:.0f} MiB; "
          f"all resident: GPU peak {resident_peak / MiB:.0f} MiB "
          f"({c['model_state_bytes'] / MiB:.0f} MiB of weights, gradients and states)")
    if not c["losses_equal"]:
        sys.exit(f"losses differ: {c['losses']}")
    if c["weights_differ"]:
        sys.exit(f"weights differ: {c['weights_differ']}")
