"""The recipes' model folder (examples/recipes/write_llama.py) without a GPU:
a tiny Llama written as Hugging Face writes one, every weight named once in
the index, read by offload's checkpoint reader and by transformers alike,
and estimated from the folder."""
import json
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
