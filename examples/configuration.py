"""Configuration (docs/configuration.md): PYTORCH_UVM_ALLOC_CONF, read when
torch_uvm is imported; PYTORCH_ENABLE_UNIFIED_MEMORY; and the switches you
can flip at run time.

    python examples/configuration.py

Runs without a GPU (the CI runs it so); with one, it also sets the memory
cap and a residency limit.
"""
import os
import subprocess
import sys

# Set before torch_uvm is imported: the options are checked at import and
# read when the allocator starts. Usually set in the shell:
#   PYTORCH_UVM_ALLOC_CONF=max_split_size_mb:128,release_threshold_mb:64 python train.py
os.environ["PYTORCH_UVM_ALLOC_CONF"] = "max_split_size_mb:128,release_threshold_mb:64"

import torch  # noqa: E402

# From a checkout, without installing torch_uvm: the repository's copy.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(REPOSITORY)
import torch_uvm  # noqa: E402

MiB = 1 << 20


def python(code, **env):
    """Runs `code` in a fresh interpreter with `env` added to the environment."""
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([REPOSITORY, os.environ.get("PYTHONPATH", "")]))
    full.pop("PYTORCH_ENABLE_UNIFIED_MEMORY", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


def environment_variables():
    bad = python("import torch_uvm", PYTORCH_UVM_ALLOC_CONF="max_split_size_mb:128,bogus:1")
    assert bad.returncode != 0 and "unknown option 'bogus'" in bad.stderr, bad.stderr
    print("a bad PYTORCH_UVM_ALLOC_CONF is refused at import: "
          + bad.stderr.strip().splitlines()[-1][:90] + "...")
    off = python("import torch_uvm; print(torch_uvm.get_enabled_uvm())",
                 PYTORCH_ENABLE_UNIFIED_MEMORY="0")
    assert off.returncode == 0 and off.stdout.strip() == "False", off.stderr
    bad = python("import torch_uvm", PYTORCH_ENABLE_UNIFIED_MEMORY="maybe")
    assert bad.returncode != 0 and "expected 1/0" in bad.stderr, bad.stderr
    print("PYTORCH_ENABLE_UNIFIED_MEMORY=0 leaves UVM off; 'maybe' is refused at import")


def switches():
    assert torch_uvm.get_move_on_copy()                  # moves are the same memory ...
    torch_uvm.set_move_on_copy(False)                    # ... or copies, as PyTorch's do
    assert not torch_uvm.get_move_on_copy()
    torch_uvm.set_move_on_copy(True)
    assert torch_uvm.get_fast_copy() and not torch_uvm.get_move_advice()
    torch_uvm.set_move_advice(True)                      # advise on every move, too
    torch_uvm.set_move_advice(False)
    print("switches: move_on_copy, fast_copy, move_advice")


def with_a_gpu():
    torch_uvm.set_enabled_uvm(True)
    print(f"the memory cap: {torch_uvm.get_memory_cap() / 2**30:.1f} GiB")
    torch_uvm.set_release_threshold(64 * MiB)            # what empty_cache() keeps
    torch_uvm.set_residency_limit(0.25)                  # a quarter of the cap, for streaming
    print(f"residency limit on cuda:0: {torch_uvm.get_residency_limit() / 2**30:.1f} GiB")
    torch_uvm.set_residency_limit(None)


def main():
    environment_variables()
    switches()
    if torch.cuda.is_available():
        with_a_gpu()
    else:
        print("no GPU here: the memory cap, release threshold and residency limits need one")


if __name__ == "__main__":
    main()
