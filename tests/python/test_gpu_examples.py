"""Each training example in examples/training/, offloaded, against the same
code all resident, in a fresh process: losses and weights equal bit for
bit; the offloads' books within their budgets; and PyTorch's own measure of
the GPU memory (``max_memory_allocated``, which counts torch_uvm's slots
with UVM off, as here) within twice the budget plus what the resident run
held beside its weights, gradients and states (activations, batches,
cuBLAS' workspace) plus SLACK. Twice: an offload's slots come from one range
of its budget's size, and gradients and optimizer states made by PyTorch on
the GPU (adopted, and on their way home) live beside that range, counted in
the same budget's books, so the process holds at most the range and the
books' budget beside it (measured 2026-11-25 on an H100: 168 MiB for the GAN's
two 24 MiB budgets, where budget + activations + 64 MiB is 144). An example
whose framework is not installed skips.

The resident run's peak holds its full activations (end of forward) or its
full gradients (end of backward), not both, so "beside" undercounts the
activations by the smaller of the two: the examples keep their activations
to tens of MiB."""
import json
import os

import pytest

from conftest import ROOT, gpu, run_python

pytestmark = gpu
FOLDER = os.path.join(ROOT, "examples", "training")
EXAMPLES = sorted(f[:-3] for f in os.listdir(FOLDER) if f.endswith(".py") and not f.startswith("_"))
NEEDS = {                             # the frameworks an example imports
    "lightning_trainer": ["lightning"],
    "lightning_fabric": ["lightning"],
    "hf_trainer": ["transformers", "accelerate"],
    "accelerate_loop": ["accelerate"],
    "peft_lora": ["transformers", "peft"],
}
# More runs of an example: (example, its train()'s keyword arguments)
VARIANTS = {"lightning_trainer-16-mixed": ("lightning_trainer", {"precision": "16-mixed"})}
MiB = 1 << 20
# What an offloaded run may hold beyond the budget and the resident run's
# activations: gradients and first optimizer states made by PyTorch on their
# way home, the step's temporaries.
SLACK = 64 * MiB
# Each example streams one model through one GPU, shown one GPU as its
# docstring asks on a machine of several (a Trainer that sees two wraps the
# model in DataParallel, which stream_trainer refuses: 2026-11-29, two H200s).
ONE_GPU = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]

CHILD = """
    import importlib, json, sys
    import pytest
    sys.path.insert(0, {folder!r})
    try:
        for framework in {needs!r}:
            pytest.importorskip(framework)
    except pytest.skip.Exception as e:
        print("RESULT", json.dumps({{"skip": str(e)}}))
        sys.exit(0)
    from _common import compare
    example = importlib.import_module({name!r})
    print("RESULT", json.dumps(compare(example.train(False, **{kwargs!r}),
                                       example.train(True, **{kwargs!r}))))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", EXAMPLES + sorted(VARIANTS))
def test_example_trains_offloaded_as_all_resident(name):
    name, kwargs = VARIANTS.get(name, (name, {}))
    r = run_python(CHILD.format(folder=FOLDER, needs=NEEDS.get(name, []), name=name,
                                kwargs=kwargs),
                   env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUDA_VISIBLE_DEVICES": ONE_GPU},
                   timeout=280)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = json.loads([line for line in r.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    if "skip" in out:
        pytest.skip(out["skip"])
    resident_losses, offloaded_losses = out["losses"]
    assert resident_losses and offloaded_losses == resident_losses
    assert out["weights"] > 0 and out["weights_differ"] == []
    assert 0 < out["share_peak"] <= out["budget"], out
    resident_peak, offloaded_peak = out["gpu_peak"]
    beside_the_model = max(resident_peak - out["model_state_bytes"], 0)
    assert offloaded_peak <= 2 * out["budget"] + beside_the_model + SLACK, \
        (f"GPU peak {offloaded_peak / MiB:.1f} MiB offloaded: 2 x budget "
         f"{out['budget'] / MiB:.1f} + {beside_the_model / MiB:.1f} beside the model all "
         f"resident + {SLACK // MiB} MiB")
