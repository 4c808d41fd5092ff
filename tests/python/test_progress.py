"""Progress on an offload's long waits (torch_uvm/progress.py), without a
GPU: when it shows, what it counts from several threads, and how it is
silenced. test_gpu_offload.py checks that an offload shows it."""
import io
import threading

import pytest

from torch_uvm import progress


def test_it_shows_from_a_gib_unless_told_or_quiet(monkeypatch):
    monkeypatch.delenv("TORCH_UVM_QUIET", raising=False)
    assert progress.shown(None, progress.SHOW_FROM)
    assert not progress.shown(None, progress.SHOW_FROM - 1)
    assert progress.shown(True, 1) and not progress.shown(False, 1 << 40)
    monkeypatch.setenv("TORCH_UVM_QUIET", "1")
    assert not progress.shown(None, 1 << 40)
    assert progress.shown(True, 1)          # asked for: shown, quiet or not


@pytest.mark.parametrize("variable", ["TORCH_UVM_QUIET", "TORCH_UVM_HOST_STEP_THREADS"])
@pytest.mark.parametrize("asked, total", [(None, 1 << 40), (None, 1), (True, 1), (False, 1)])
def test_a_bad_offload_variable_is_refused_whatever_the_size_or_the_ask(
        monkeypatch, variable, asked, total):
    """Each offload parses all its variables (docs/configuration.md), not
    only those of offloads large enough to show their progress."""
    monkeypatch.setenv(variable, "loudly")
    with pytest.raises(ValueError, match=variable):
        progress.shown(asked, total)


@pytest.mark.parametrize("bad", ["yes", 1, 0.5])
def test_a_progress_that_is_not_a_bool_or_none_is_refused(bad):
    with pytest.raises(ValueError, match="progress is True"):
        progress.check(bad)


def test_updates_from_reader_threads_add_up_and_it_says_so_once():
    out = io.StringIO()
    with progress.Progress(8 * 1000, "torch_uvm: pinning homes", True, stream=out) as p:
        threads = [threading.Thread(target=lambda: [p.update(10) for _ in range(100)])
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert p.done == 8000
    lines = [line for line in out.getvalue().splitlines() if "GiB in" in line]
    assert len(lines) == 1 and lines[0].startswith("torch_uvm: pinning homes: 0.00 GiB in")
    p.close()                                # closed twice: still one line
    assert out.getvalue().count("GiB in") == 1


def test_hidden_it_prints_nothing():
    out = io.StringIO()
    with progress.Progress(1 << 40, "torch_uvm: pinning homes", False, stream=out) as p:
        p.update(1 << 30)
    assert out.getvalue() == ""


def test_a_checkpoints_reads_count_their_bytes_as_they_complete(tmp_path):
    """The reader threads tell the progress each read's bytes once it is
    done (not when it is queued), and a failed read counts nothing."""
    import torch
    from safetensors.torch import save_file
    from torch_uvm import checkpoint
    tensors = {f"w{i}": torch.randn(256, 64) for i in range(6)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    entries = checkpoint.read_checkpoint(str(tmp_path))
    seen = progress.Progress(sum(t.nbytes for t in tensors.values()), "reading", False)
    reader = checkpoint.Reader()
    outs = {name: torch.empty(256, 64) for name in tensors}
    for name, out in outs.items():
        reader.submit(entries[name], out, seen.update)
    reader.close()
    assert seen.done == seen.total
    assert all(torch.equal(outs[n], tensors[n]) for n in tensors)


def test_a_failed_wait_says_nothing_was_done():
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with progress.Progress(1 << 30, "torch_uvm: pinning homes", True, stream=out) as p:
            p.update(1 << 20)
            raise RuntimeError("out of pinned memory")
    assert "GiB in" not in out.getvalue()
