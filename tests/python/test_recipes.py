"""The recipes' model folder (examples/recipes/write_llama.py) without a GPU:
a tiny Llama written as Hugging Face writes one, every weight named once in
the index, read by offload's checkpoint reader and by transformers alike,
and estimated from the folder."""
import json
import subprocess
import os
import sys

import pytest
import torch

from torch_uvm.checkpoint import read_checkpoint
from torch_uvm.estimate import estimate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "recipes"))
import write_llama  # noqa: E402


def test_a_written_model_folder_is_read_as_a_downloaded_one(tmp_path, monkeypatch):
    monkeypatch.setattr(write_llama, "SHARD_BYTES", 600_000)    # several shards
    config = write_llama.write(str(tmp_path), "tiny")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    names = [n for n, _ in write_llama.tensors(config)]
    assert sorted(index["weight_map"]) == sorted(names)
    assert len(set(index["weight_map"].values())) > 1
    entries = read_checkpoint(str(tmp_path))              # offload(checkpoint=folder) reads these
    assert sorted(entries) == sorted(names)
    est = estimate(str(tmp_path), task="generate", link_gbps=None)
    assert est.weights == index["metadata"]["total_size"]
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert model.dtype == torch.bfloat16
    state = model.state_dict()
    assert sorted(state) == sorted(names)
    from safetensors.torch import load_file
    for file in set(index["weight_map"].values()):
        for name, t in load_file(str(tmp_path / file)).items():
            assert torch.equal(state[name], t), name
    assert model(torch.randint(0, 512, (1, 8))).logits.shape == (1, 8, 512)


RECIPES = ["generate_7b", "lora_7b", "full_7b"]


def run_recipe(name, folder, *args):
    from conftest import _child_env
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", "recipes", name + ".py"),
                           str(folder), *args], cwd=ROOT, env=_child_env(), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    write_llama.write(str(folder), "tiny")
    return folder


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_estimates_from_the_folder_and_without_a_gpu_says_what_it_would_run(
        tiny_folder, name):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    if name == "lora_7b":
        pytest.importorskip("peft")
    from conftest import HAS_GPU
    if HAS_GPU:
        pytest.skip("with a GPU, test_a_recipe_runs_a_tiny_model_within_24_gib runs it")
    r = run_recipe(name, tiny_folder)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "torch_uvm estimate:" in r.stdout and "no GPU here" in r.stdout, r.stdout


def test_the_lora_recipe_gives_its_adapters_memory_and_their_first_values(tiny_folder):
    """The base stays on the meta device (offload reads it from the folder);
    the adapters are real: A drawn, B zero, as PEFT makes them."""
    pytest.importorskip("peft")
    sys.path.insert(0, os.path.join(ROOT, "examples", "recipes"))
    import lora_7b
    model = lora_7b.lora_model(str(tiny_folder))
    adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert adapters and all(not p.is_meta for p in adapters.values())
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())
    assert all(p.is_meta for n, p in model.named_parameters() if "lora_" not in n)
    assert all(torch.count_nonzero(p) > 0 for n, p in adapters.items() if "lora_A" in n)
    assert all(torch.count_nonzero(p) == 0 for n, p in adapters.items() if "lora_B" in n)


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_runs_a_tiny_model_within_24_gib(tiny_folder, name):
    from conftest import HAS_GPU
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    r = run_recipe(name, tiny_folder, "--batch", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "tokens/s" in r.stdout and "(within 24 GiB)" in r.stdout, r.stdout
