"""checkpoint.py without a GPU: safetensors headers read as the library reads
them, bytes read straight into given memory, and every bad input refused
by name before anything is read. (offload(checkpoint=) itself:
test_gpu_checkpoint.py.)"""
import json
import os
import struct
import threading

import pytest
import torch

from torch_uvm import checkpoint

st = pytest.importorskip("safetensors.torch")


def tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "layers.0.proj.weight": torch.randn(5, 5, generator=g),
        "layers.0.proj.bias": torch.randn(5, generator=g).half(),
        "layers.0.norm.weight": torch.ones(5, dtype=torch.float64),
        "steps": torch.arange(3),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "model.safetensors"
    st.save_file(tensors(), str(path), metadata={"format": "pt"})
    return path


def test_reads_each_tensor_as_the_library_does(saved):
    entries = checkpoint.read_checkpoint(saved)
    want = st.load_file(str(saved))
    assert set(entries) == set(want)
    for name, t in want.items():
        e = entries[name]
        assert (e.dtype, e.shape, e.nbytes) == (t.dtype, tuple(t.shape), t.nbytes)
        out = torch.full(t.shape, 3, dtype=t.dtype)
        checkpoint.read_into(e, out)
        assert torch.equal(out, t), name


def test_reads_in_chunks_and_casts_a_chunk_at_a_time(saved, monkeypatch):
    e = checkpoint.read_checkpoint(saved)["layers.0.proj.weight"]
    monkeypatch.setattr(checkpoint, "CHUNK", 12)    # three fp32 elements a read
    out = torch.empty(5, 5, dtype=torch.float64)     # another dtype: read, then cast
    made = []
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: made.append(a) or empty(*a, **k))
    checkpoint.read_into(e, out)
    monkeypatch.undo()
    assert torch.equal(out, tensors()["layers.0.proj.weight"].double())
    assert made == [(3,)]                            # a buffer of one chunk, not the tensor
    monkeypatch.setattr(checkpoint, "CHUNK", 12)
    same = torch.empty(5, 5)
    checkpoint.read_into(e, same)                    # 25 elements, 3 a read
    assert torch.equal(same, tensors()["layers.0.proj.weight"])


def test_a_folder_by_its_index_or_its_files(tmp_path):
    t = tensors()
    st.save_file({k: v for k, v in t.items() if k.startswith("layers")},
                 str(tmp_path / "model-00002-of-00002.safetensors"))
    st.save_file({k: v for k, v in t.items() if not k.startswith("layers")},
                 str(tmp_path / "model-00001-of-00002.safetensors"))
    (tmp_path / "unrelated.safetensors").write_bytes(b"")
    assert set(checkpoint.read_checkpoint([tmp_path / "model-00001-of-00002.safetensors",
                                           tmp_path / "model-00002-of-00002.safetensors"])) == set(t)
    weight_map = {k: ("model-00002-of-00002.safetensors" if k.startswith("layers")
                      else "model-00001-of-00002.safetensors") for k in t}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert set(checkpoint.read_checkpoint(tmp_path)) == set(t)   # the index's files only
    weight_map["extra"] = "model-00003-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(FileNotFoundError, match="not found: .*model-00003-of-00002.safetensors"):
        checkpoint.read_checkpoint(tmp_path)                      # a shard the index names
    os.remove(tmp_path / "model.safetensors.index.json")
    with pytest.raises(ValueError, match="unrelated.safetensors' is not a safetensors file"):
        checkpoint.read_checkpoint(tmp_path)                      # every file then


def test_bad_checkpoints_are_named(tmp_path, saved):
    with pytest.raises(FileNotFoundError, match="not found: .*nowhere.safetensors"):
        checkpoint.read_checkpoint(tmp_path / "nowhere.safetensors")
    with pytest.raises(TypeError, match="takes a .safetensors file"):
        checkpoint.read_checkpoint(3)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no .safetensors files"):
        checkpoint.read_checkpoint(empty)
    with pytest.raises(ValueError, match="in two checkpoint files"):
        checkpoint.read_checkpoint([saved, saved])
    raw = saved.read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(raw[:-8])
    with pytest.raises(ValueError, match="'layers.0.proj.weight'|damaged or truncated"):
        checkpoint.read_checkpoint(tmp_path / "truncated.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="not a safetensors file"):
        checkpoint.read_checkpoint(tmp_path / "text.safetensors")
    for bad in ({"dtype": "C64", "shape": [1], "data_offsets": [0, 8]},
                {"dtype": "F32", "shape": [-1, -2], "data_offsets": [0, 8]}):
        header = json.dumps({"x": bad}).encode()
        (tmp_path / "odd.safetensors").write_bytes(struct.pack("<Q", len(header)) + header
                                                   + bytes(8))
        with pytest.raises(ValueError, match="'x' has a dtype or layout this reader does not"):
            checkpoint.read_checkpoint(tmp_path / "odd.safetensors")
    (tmp_path / "list.safetensors").write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(ValueError, match="its header is not a JSON object but a list"):
        checkpoint.read_checkpoint(tmp_path / "list.safetensors")
    header = json.dumps({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "complex.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match="'x' has a dtype or layout this reader does not know"):
        checkpoint.read_checkpoint(tmp_path / "complex.safetensors")
    (tmp_path / "json.safetensors").write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(ValueError, match="header is not JSON"):
        checkpoint.read_checkpoint(tmp_path / "json.safetensors")


def test_a_file_cut_after_its_header_was_read(saved, tmp_path):
    e = checkpoint.read_checkpoint(saved)["layers.0.proj.weight"]
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(saved.read_bytes()[:e.begin + 4])
    e.path = str(cut)
    with pytest.raises(OSError, match="ended early"):
        checkpoint.read_into(e, torch.empty(5, 5))


class Tied(torch.nn.Module):
    def __init__(self, device="meta"):
        super().__init__()
        self.embed = torch.nn.Embedding(7, 5, device=device)
        self.head = torch.nn.Linear(5, 7, bias=False, device=device)
        self.head.weight = self.embed.weight
        self.register_buffer("inv_freq", torch.ones(2, device=device), persistent=False)


def test_names_and_matching():
    m = Tied()
    names = checkpoint.names_by_tensor(m)
    assert names[id(m.embed.weight)] == ["embed.weight", "head.weight"]
    tensors = {id(t): t for t in list(m.parameters()) + list(m.buffers())}
    e = checkpoint.Entry("f", "x", torch.float32, (7, 5), 8, 8 + 140)
    # a tied tensor found by any of its names; the buffer on the meta device is missing
    with pytest.raises(ValueError, match=r"inv_freq \(1 in all\) are on the meta device and not "
                                         r"in the checkpoint, which has model.x unused"):
        checkpoint.match({"head.weight": e, "model.x": e}, names, tensors)
    m.inv_freq = torch.ones(2)                       # a value of its own: nothing missing
    tensors = {id(t): t for t in list(m.parameters()) + list(m.buffers())}
    names = checkpoint.names_by_tensor(m)
    assert checkpoint.match({"head.weight": e}, names, tensors) == {id(m.embed.weight): e}
    wrong = checkpoint.Entry("f", "x", torch.float32, (5, 7), 8, 8 + 140)
    with pytest.raises(ValueError, match=r"'embed.weight' is \[5, 7\] in the checkpoint .* and "
                                         r"\[7, 5\] in the module"):
        checkpoint.match({"embed.weight": wrong}, names, tensors)


class Adapted(torch.nn.Module):
    """A Linear as PEFT's LoRA wraps it: the base under `base_layer`, the
    adapters beside it (with values of their own, off the meta device)."""

    def __init__(self, base):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(5, 2, bias=False)})
        self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(2, 7, bias=False)})


def peft_like(model):
    """`model` as get_peft_model wraps it: base_model.model.<its names>,
    its head adapted."""
    model.head = Adapted(model.head)
    inner = torch.nn.Module()
    inner.model = model
    outer = torch.nn.Module()
    outer.base_model = inner
    return outer


def test_a_peft_model_takes_its_base_models_checkpoint_by_the_base_names():
    """PEFT's names gain "base_model.model." and ".base_layer"; a base
    model's checkpoint names its tensors without them. Each tensor also goes
    by its base name, after its own, so both kinds of checkpoint load."""
    m = Tied()
    m.inv_freq = torch.ones(2)
    wrapped = peft_like(m)
    names = checkpoint.names_by_tensor(wrapped)
    assert names[id(m.embed.weight)] == [
        "base_model.model.embed.weight", "base_model.model.head.base_layer.weight",
        "embed.weight", "head.weight"]
    adapter = m.head.lora_A["default"].weight
    assert names[id(adapter)] == ["base_model.model.head.lora_A.default.weight",
                                  "head.lora_A.default.weight"]
    tensors = {id(t): t for t in list(wrapped.parameters()) + list(wrapped.buffers())}
    e = checkpoint.Entry("f", "x", torch.float32, (7, 5), 8, 8 + 140)
    found = checkpoint.match({"embed.weight": e}, names, tensors)      # a base checkpoint
    assert found == {id(m.embed.weight): e}
    found = checkpoint.match({"base_model.model.embed.weight": e}, names, tensors)   # PEFT's own
    assert found == {id(m.embed.weight): e}


def test_the_reader_reads_on_threads_and_reports_the_first_failure(saved, tmp_path):
    entries = checkpoint.read_checkpoint(saved)
    want = st.load_file(str(saved))
    outs = {n: torch.zeros(e.shape, dtype=e.dtype) for n, e in entries.items()}
    reader = checkpoint.Reader(threads=3)
    for n, e in entries.items():
        reader.submit(e, outs[n])
    reader.close()
    assert all(torch.equal(outs[n], want[n]) for n in want)
    cut = tmp_path / "cut.safetensors"
    e = entries["layers.0.proj.weight"]
    cut.write_bytes(saved.read_bytes()[:e.begin + 4])
    bad = checkpoint.Entry(str(cut), e.name, e.dtype, e.shape, e.begin, e.end)
    reader = checkpoint.Reader(threads=2)
    reader.submit(entries["embed.weight"], torch.empty(7, 5, dtype=torch.bfloat16))
    reader.submit(bad, torch.empty(5, 5))
    files = list(reader._files.values())
    with pytest.raises(OSError, match="ended early"):
        reader.close()
    assert len(files) == 2 and all(f.closed for f in files)
    # the caller failing: the reads not begun are dropped, the rest waited
    # for, and their own failures not raised over the caller's
    gate = threading.Event()
    reader = checkpoint.Reader(threads=1)
    reader.submit(bad, torch.empty(5, 5))     # fails on the only thread
    reader._pool.submit(gate.wait)            # then holds it
    late = torch.zeros(7, 5, dtype=torch.bfloat16)
    reader.submit(entries["embed.weight"], late)
    files = list(reader._files.values())
    threading.Timer(0.2, gate.set).start()
    reader.close(failed=True)
    assert not late.any() and all(f.closed for f in files)
