"""What works without a GPU: import, flags, configuration parsing, and every
error that needs no GPU. Runs in CI."""
import pytest
import torch

import torch_uvm
from conftest import HAS_GPU, run_python, run_script


def test_public_api_is_documented():
    for name in torch_uvm.__all__:
        obj = getattr(torch_uvm, name)
        if callable(obj):
            assert obj.__doc__, f"{name} has no docstring"


def test_tensor_methods_are_installed():
    t = torch.zeros(4)
    for method in ("is_managed", "manage_memory", "unmanage_memory", "uvm_to"):
        assert hasattr(t, method)
    # Managed exactly when UVM is on (the GPU session turns it on).
    assert t.is_managed() is torch_uvm.get_enabled_uvm()
    assert torch_uvm.is_managed(t.unmanage_memory()) is False


def test_flags_round_trip():
    assert torch_uvm.get_move_on_copy() is True
    torch_uvm.set_move_on_copy(False)
    assert torch_uvm.get_move_on_copy() is False
    torch_uvm.set_move_on_copy(True)
    assert torch_uvm.get_move_advice() is False
    torch_uvm.set_move_advice(True)
    assert torch_uvm.get_move_advice() is True
    torch_uvm.set_move_advice(False)


@pytest.mark.skipif(HAS_GPU, reason="UVM is on in the GPU session")
def test_stats_have_torch_keys_before_any_allocation():
    stats = torch_uvm.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak",
                "active.small_pool.allocated", "inactive_split_bytes.all.freed",
                "requested_bytes.all.current", "num_alloc_retries", "num_ooms",
                "segment.all.current", "allocation.all.peak"):
        assert stats[key] == 0, key
    assert "Allocated memory" in torch_uvm.memory_summary()
    assert torch_uvm.memory_snapshot() == []


def test_cpu_ops_unaffected_by_loaded_kernels():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = x.to(torch.float64)
    assert y.dtype == torch.float64 and torch.equal(y, x.double())
    z = x.to("cpu", copy=True)
    assert z.data_ptr() != x.data_ptr() and torch.equal(z, x)
    assert x.to("cpu") is x
    w = x.t().to(torch.float64, memory_format=torch.contiguous_format)
    assert torch.equal(w, x.t().double())


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error")
def test_enabling_without_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA or ROCm device was found"):
        torch_uvm.set_enabled_uvm(True)
    assert torch_uvm.get_enabled_uvm() is False
    # Nothing was changed: CPU tensors still come from the default allocator.
    assert not torch.ones(8).is_managed()


def test_disabling_while_off_is_a_no_op():
    r = run_python("""
        import torch, torch_uvm
        torch_uvm.set_enabled_uvm(False)
        print(torch_uvm.get_enabled_uvm(), torch.ones(2).is_managed())
    """)
    assert r.stdout.split() == ["False", "False"], r.stdout + r.stderr


def test_set_enabled_requires_a_bool():
    with pytest.raises(TypeError):
        torch_uvm.set_enabled_uvm("yes")


@pytest.mark.parametrize("call, match", [
    (lambda: torch_uvm.prefetch(torch.ones(2).unmanage_memory()), "not managed"),
    (lambda: torch_uvm.advise(torch.ones(2).unmanage_memory(), "read_mostly"), "not managed"),
    (lambda: torch_uvm.advise(torch.ones(2), 5), "advice must be a str"),
    (lambda: torch_uvm.set_memory_cap(1.5), r"\(0, 1\]"),
    (lambda: torch_uvm.set_memory_cap(-3), "positive"),
    (lambda: torch_uvm.set_memory_cap("1 gigabyte"), r"the cap must be bytes.*'20GiB'"),
    (lambda: torch_uvm.set_release_threshold("1G"), "the release threshold must be bytes"),
    (lambda: torch_uvm.set_release_threshold(None), "the release threshold must be bytes"),
    (lambda: torch_uvm.set_release_threshold(-1), ">= 0"),
    (lambda: torch_uvm.manage_memory(torch.ones(2).to_sparse()), "strided"),
    (lambda: list(torch_uvm.prefetching([torch.ones(2)], "cuda", ahead=0)),
     "ahead must be a positive int"),
    (lambda: torch_uvm._C.set_copy_mechanisms("fast", "kernel"),
     "'copy_engine' or 'kernel', got 'fast'"),
])
def test_bad_input_is_a_clear_exception(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize("conf, match", [
    ("bogus:1", "unknown option 'bogus'"),
    ("max_split_size_mb", "expected 'key:value'"),
    ("max_split_size_mb:-1", "non-negative number"),
    ("cap_fraction:2", r"\(0, 1\]"),
    ("allow_oversubscription:perhaps", "expected 1/0"),
])
def test_malformed_alloc_conf_is_rejected_at_import(conf, match):
    result = run_python("import torch_uvm", env={"PYTORCH_UVM_ALLOC_CONF": conf})
    assert result.returncode != 0
    assert "ValueError" in result.stderr and "PYTORCH_UVM_ALLOC_CONF" in result.stderr
    import re
    assert re.search(match, result.stderr), result.stderr


def test_valid_alloc_conf_imports():
    result = run_python("import torch_uvm",
                        env={"PYTORCH_UVM_ALLOC_CONF": "max_split_size_mb:128,release_threshold_mb:64"})
    assert result.returncode == 0, result.stderr


def test_malformed_enable_variable_is_rejected():
    result = run_python("import torch_uvm", env={"PYTORCH_ENABLE_UNIFIED_MEMORY": "maybe"})
    assert result.returncode != 0
    assert "PYTORCH_ENABLE_UNIFIED_MEMORY" in result.stderr and "expected 1/0" in result.stderr


def test_disabled_environment_values_do_nothing():
    result = run_python("import torch_uvm; print(torch_uvm.get_enabled_uvm())",
                        env={"PYTORCH_ENABLE_UNIFIED_MEMORY": "0"})
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error")
def test_enable_variable_without_gpu_names_the_problem():
    result = run_python("import torch_uvm", env={"PYTORCH_ENABLE_UNIFIED_MEMORY": "1"})
    assert result.returncode != 0 and "no CUDA or ROCm device" in result.stderr


def test_options_are_described():
    lines = torch_uvm._C.describe_options()
    assert any(line.startswith("max_split_size_mb") for line in lines)


def test_code_outside_the_main_guard_is_told_apart(tmp_path):
    # forkserver and spawn re-run a script in each child: only code outside
    # `if __name__ == "__main__":` runs again there (issue 11).
    r = run_script(tmp_path / "script.py", """
        import torch_uvm._workers as w
        def helper():
            return w.runs_outside_main_guard()
        top = w.runs_outside_main_guard()
        via_function = helper()
        if __name__ == "__main__":
            print(top, via_function, w.runs_outside_main_guard(), helper())
    """)
    assert r.stdout.split() == ["True", "True", "False", "False"], r.stdout + r.stderr
    r = run_python("import torch_uvm._workers as w; print(w.runs_outside_main_guard())")
    assert r.stdout.split() == ["False"], r.stdout + r.stderr   # `-c` is never re-run


def test_summary_shows_each_gpus_residency():
    from torch_uvm._summary import format_summary
    stats = {"residency.cuda:0.limit": 1 << 30, "residency.cuda:0.resident_bytes.current": 3 << 20,
             "residency.cuda:0.resident_bytes.peak": 1 << 30,
             "residency.cuda:0.evictions.drop": 7, "residency.cuda:0.evictions.discard": 2}
    text = format_summary(stats)
    assert "Residency on cuda:0: limit 1.00 GiB" in text
    assert "resident 3.00 MiB, peak 1.00 GiB" in text
    assert "evictions by drop: 7" in text and "evictions by discard: 2" in text
    assert "Residency" not in format_summary({})


def test_span_bytes_covers_what_a_prefetch_moves():
    from torch_uvm import _C
    base = torch.zeros(4, 6, 5)
    assert _C.span_bytes(base) == 4 * 6 * 5 * 4
    view = base[1:, ::2, 1:4]                  # strided: first to last element
    assert _C.span_bytes(view) == (1 + 2 * 30 + 2 * 10 + 2 * 1) * 4
    assert _C.span_bytes(view.transpose(0, 2)) == _C.span_bytes(view)
    assert _C.span_bytes(base[:, :0]) == 0
    assert _C.span_bytes(torch.zeros(7, dtype=torch.float16)) == 14


def test_adopt_copy_in_forked_child_is_refused_outside_a_forked_child():
    # torch_uvm/_workers.py calls it in a DataLoader worker right after fork();
    # anywhere else it would point a storage at memory it must not own.
    from torch_uvm import _C
    owner = torch.ones(16)
    before = owner.data_ptr()
    with pytest.raises(RuntimeError, match="is for a process made by fork"):
        _C.adopt_copy_in_forked_child(owner, torch.zeros(16))
    assert owner.data_ptr() == before and torch.equal(owner, torch.ones(16))


def _on_fake_gpus(*devices):
    """A Sequential of one Linear per device, whose tensors say they are on
    those GPUs (fake tensors: no GPU needed, none touched)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    layers = [torch.nn.Linear(4, 4, device="meta") for _ in devices]
    with FakeTensorMode():   # empty tensors only: an initializer's kernels may run on the device
        for layer, d in zip(layers, devices):
            layer.weight = torch.nn.Parameter(torch.empty(4, 4, device=d))
            layer.bias = torch.nn.Parameter(torch.empty(4, device=d))
    return torch.nn.Sequential(*layers)


def test_offloading_a_module_on_two_gpus_or_another_gpu_names_the_devices(monkeypatch):
    # What offload checks is the devices of the module's tensors against the
    # one it streams to: fake tensors on cuda:0 and cuda:1 show it on any
    # machine (test_gpu_reliability.py does it with real ones on two GPUs).
    import torch._subclasses.fake_tensor as fake_tensor
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    # on a machine with a GPU, a fake tensor's first use of a device starts a
    # context there (an empty tensor): on one GPU, cuda:1 has none to start
    monkeypatch.setattr(fake_tensor, "init_gpu_context", lambda device: None, raising=False)
    for devices, on, target in [(("cuda:0", "cuda:1"), r"\['cuda:0', 'cuda:1'\]", "cuda:0"),
                                (("cuda:1", "cuda:1"), r"\['cuda:1'\]", "cuda:0"),
                                (("cpu", "cuda:0"), r"\['cpu', 'cuda:0'\]", "cuda:1")]:
        model = _on_fake_gpus(*devices)
        params = list(model.parameters())
        with pytest.raises(ValueError, match=rf"the module's tensors are on {on}; offload needs "
                                             rf"them on the CPU or on {target} alone"):
            torch_uvm.offload(model, budget=1 << 20, device=target)
        assert all(a is b for a, b in zip(model.parameters(), params))
        assert getattr(model, "_torch_uvm_offloaded", None) is None
