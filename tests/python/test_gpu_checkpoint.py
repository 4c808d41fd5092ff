"""offload(checkpoint=): a model built without weights streams from homes its
safetensors files were read straight into, the host holding the weights
once (its resident memory measured by the kernel, apart from our books),
with the values, ties and undo of a model loaded the usual way; bad input
is refused before anything changes. And an offload of a model in managed
CPU memory (UVM on) gives that memory back to the host."""
import json
import sys

import pytest
import torch

import torch_uvm
from torch_uvm import checkpoint
from conftest import gpu, run_python, where
from offload_helpers import undo_leftover_offloads

st = pytest.importorskip("safetensors.torch")
pytestmark = gpu
MiB = 1 << 20


class Tied(torch.nn.Module):
    """Embedding and head tied, a persistent buffer, a bias."""

    def __init__(self, device=None):
        super().__init__()
        self.embed = torch.nn.Embedding(512, 256, device=device)
        self.mid = torch.nn.Linear(256, 256, device=device)
        self.head = torch.nn.Linear(256, 512, bias=False, device=device)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.full((256,), 0.5, device=device))

    def forward(self, ids):
        return self.head(self.mid(self.embed(ids)) * self.scale)


@pytest.fixture(autouse=True)
def _clean():
    yield
    undo_leftover_offloads()


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    ref = Tied()
    ref.scale.uniform_()
    path = tmp_path / "tied.safetensors"
    st.save_model(ref, str(path))          # the tie saved once, as safetensors does
    return ref, path


def test_a_meta_model_streams_the_checkpoints_values_and_undo_gives_them_back(saved):
    ref, path = saved
    ids = torch.randint(0, 512, (4, 16), device="cuda")
    want = ref.cuda()(ids)
    with torch.device("meta"):
        model = Tied()
    handle = torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=path)
    assert model.head.weight is model.embed.weight                  # still tied
    assert all(where(t) == "host" for t in model.parameters())       # in their homes
    assert isinstance(model.mid.weight, torch.nn.Parameter) and model.mid.weight.requires_grad
    assert torch.equal(model(ids), want)
    assert torch.equal(model(ids), want)                              # the plan made, streamed
    handle.undo()
    assert model.head.weight is model.embed.weight
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.device.type == "cpu" and not t.is_meta, name
        assert torch.equal(t, ref.state_dict()[name].cpu()), name
    assert model.mid.weight.requires_grad and isinstance(model.mid.weight, torch.nn.Parameter)


def test_values_in_the_checkpoint_replace_the_modules_own(saved):
    ref, path = saved
    model = Tied()                          # real values, not the checkpoint's
    torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=path)
    for name, t in model.state_dict().items():
        assert torch.equal(t.cpu(), ref.state_dict()[name]), name


def test_bad_checkpoints_are_refused_before_anything_changes(saved, tmp_path):
    ref, path = saved
    with torch.device("meta"):
        model = Tied()
    partial = tmp_path / "partial.safetensors"
    st.save_file({k: v.contiguous() for k, v in ref.state_dict().items()
                  if k != "mid.bias" and k != "head.weight"}, str(partial))
    with pytest.raises(ValueError, match=r"mid.bias \(1 in all\) are on the meta device and "
                                         r"not in the checkpoint"):
        torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=partial)
    wrong = tmp_path / "wrong.safetensors"
    st.save_file({**{k: v.contiguous() for k, v in ref.state_dict().items()
                     if k != "head.weight"}, "scale": torch.ones(3)}, str(wrong))
    with pytest.raises(ValueError, match=r"'scale' is \[3\] in the checkpoint"):
        torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=wrong)
    with pytest.raises(ValueError, match="on the meta device. Load them first .* or pass their "
                                         "safetensors files as checkpoint="):
        torch_uvm.offload(model, budget=2 * MiB, device="cuda")
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    assert all(t.is_meta for t in model.state_dict().values())
    # nothing held: the same module offloads with the right checkpoint, its
    # whole budget free again
    torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=path)
    assert torch.equal(model.mid.bias.cpu(), ref.mid.bias.cpu())


@pytest.mark.parametrize("failing", ["a read", "pinning a home"])
def test_an_offload_failing_part_way_through_its_checkpoint_changes_nothing(saved, monkeypatch,
                                                                              failing):
    ref, path = saved
    with torch.device("meta"):
        model = Tied()
    offload_module = sys.modules["torch_uvm.offload"]
    calls = []
    if failing == "a read":                  # on a reader thread, after homes were pinned
        real = checkpoint._read

        def read(entry, out, f):
            calls.append(entry.name)
            if entry.name == "mid.weight":
                raise OSError("the disk failed")
            real(entry, out, f)
        monkeypatch.setattr(checkpoint, "_read", read)
        error = OSError
    else:                                     # the host cannot pin the third home
        real = offload_module._C.empty_pinned_home

        def pin(like, device):
            calls.append(tuple(like.shape))
            if len(calls) == 3:
                raise torch.OutOfMemoryError("no pinned memory left")
            return real(like, device)
        monkeypatch.setattr(offload_module._C, "empty_pinned_home", pin)
        error = torch.OutOfMemoryError
    with pytest.raises(error):
        torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=path)
    assert len(calls) >= 3, calls                            # it failed part-way
    monkeypatch.undo()
    assert getattr(model, "_torch_uvm_offloaded", None) is None
    assert all(t.is_meta for t in model.state_dict().values())
    # nothing held: the whole budget is free again, and the offload succeeds
    torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=path)
    for name, t in model.state_dict().items():
        assert torch.equal(t.cpu(), ref.state_dict()[name]), name


def test_a_checkpoint_of_another_dtype_is_cast_into_the_homes(saved, monkeypatch):
    ref, path = saved                                         # float32
    monkeypatch.setattr(checkpoint, "CHUNK", 4096)            # several chunks a tensor
    with torch.device("meta"):
        model = Tied().to(torch.bfloat16)
    torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=path)
    for name, t in model.state_dict().items():
        assert t.dtype == torch.bfloat16, name
        assert torch.equal(t.cpu(), ref.state_dict()[name].to(torch.bfloat16)), name


def test_a_hugging_face_model_folder_generates_as_from_pretrained(tmp_path):
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=4,
                                      vocab_size=1000, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path, max_shard_size="300KB")
    assert (tmp_path / "model.safetensors.index.json").exists()       # sharded, as 7Bs are
    ids = torch.randint(0, 1000, (2, 8), device="cuda")
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).cuda()
    want = loaded.generate(ids, max_new_tokens=6, do_sample=False)
    del loaded
    with accelerate.init_empty_weights():    # parameters on meta, buffers (inv_freq) kept
        model = transformers.LlamaForCausalLM(config)
    torch_uvm.offload(model, budget=2 * MiB, device="cuda", checkpoint=tmp_path)
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)


HOST_PEAK = """
    import gc, json, torch, torch_uvm
    from safetensors.torch import save_file
    MiB = 1 << 20

    def model(device):
        return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, device=device) for _ in range(16)])

    def status(field):        # the kernel's count of this process's resident memory, bytes
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))

    torch.manual_seed(0)
    ref = model("cpu")
    weights = sum(p.nbytes for p in ref.parameters())
    save_file(ref.state_dict(), {path!r})
    x = torch.randn(8, 2048, device="cuda")
    want = ref.cuda()(x)                     # the same kernels as the offload's
    del ref
    gc.collect()
    torch.cuda.empty_cache()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                         # VmHWM, the peak, from here
    base = status("VmRSS")
    with torch.device("meta"):
        m = model("meta")
    torch_uvm.offload(m, budget=64 * MiB, device="cuda", checkpoint={path!r})
    peak = status("VmHWM") - base
    same = torch.equal(m(x), want)
    print(json.dumps({{"weights": weights, "peak": peak, "same": same}}))
"""


def test_the_host_holds_the_weights_once_while_their_homes_fill(tmp_path):
    p = run_python(HOST_PEAK.format(path=str(tmp_path / "m.safetensors")))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # the homes themselves (so the count sees pinned memory), and not twice
    assert 0.9 * got["weights"] <= got["peak"] <= 1.15 * got["weights"] + 32 * MiB, got
    assert got["same"]


MANAGED_GIVEN_BACK = """
    import json, sys, torch, torch_uvm
    torch_uvm.set_enabled_uvm(True)
    MiB = 1 << 20

    def status(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))

    torch.zeros(1, device="cuda")
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(24)])   # managed, CPU
    weights = sum(p.nbytes for p in m.parameters())
    assert torch_uvm.is_managed(m[0].weight)
    sys.modules["torch_uvm.offload"].RELEASE_EVERY = 32 * MiB    # given back each 32 MiB
    path = {path!r}
    if path:                                 # their values read from a file instead
        from safetensors.torch import save_file
        save_file(m.state_dict(), path)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                         # VmHWM, the peak, from here
    before = status("VmRSS")
    torch_uvm.offload(m, budget=64 * MiB, device="cuda", checkpoint=path or None)
    print(json.dumps({{"weights": weights, "grew": status("VmRSS") - before,
                      "peak": status("VmHWM") - before}}))
"""


@pytest.mark.parametrize("from_checkpoint", [False, True])
def test_an_offload_of_managed_cpu_weights_gives_their_memory_back_to_the_host(tmp_path,
                                                                               from_checkpoint):
    path = str(tmp_path / "m.safetensors") if from_checkpoint else ""
    p = run_python(MANAGED_GIVEN_BACK.format(path=path))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # the homes replace the managed weights: the process holds them once at
    # the end, and all along where the originals go as their homes fill (a
    # checkpoint's are kept until every read is done: the offload may fail)
    assert got["grew"] < 0.25 * got["weights"], got
    if not from_checkpoint:
        assert got["peak"] < 0.25 * got["weights"], got
