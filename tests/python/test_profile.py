"""torch_uvm.profile (issue 22): the residency timeline, its summary, peaks,
JSON and plot. Driven through the residency policy itself (the process-wide
budget the streaming engine uses), so it runs without a GPU; the GPU test of
an offloaded model's timeline is in test_gpu_offload.py."""
import json
import sys
import warnings

import pytest

import torch_uvm
from torch_uvm import _C

MiB = 1 << 20
A, B, C = 0x7E0000001000, 0x7E0000002000, 0x7E0000003000   # addresses nobody else uses


@pytest.fixture
def budget():
    b = _C.residency_budget()
    b.set_limit(0, 3 * MiB)
    b.label(A, "layers.0")
    b.label(B, "layers.1")
    yield b
    for address in (A, B, C):
        b.forget(address)
        b.unlabel(address)
    b.set_limit(0, None)


def steps(b):
    b.admit(0, A, MiB, False)
    b.admit(0, B, 2 * MiB, True)        # written on the GPU
    b.admit(0, C, MiB, False)           # past the 3 MiB limit: A, the oldest, leaves
    b.evict(B)                          # written: it goes home
    b.discard(C)                        # died


def test_a_profile_records_what_arrived_and_left_by_name(budget):
    with torch_uvm.profile() as p:
        steps(budget)
    events = p.timeline()
    assert [e["kind"] for e in events] == ["arrive", "arrive", "drop", "arrive", "write_home",
                                           "discard"]
    assert [e["label"] for e in events[:3]] == ["layers.0", "layers.1", "layers.0"]
    assert {e["holder"] for e in events} == {"batches"}
    assert [e["share_resident"] // MiB for e in events] == [1, 3, 2, 3, 1, 0]
    assert all(0 <= a["time_s"] <= b["time_s"] for a, b in zip(events, events[1:]))
    assert p.peaks()["cuda:0"] == 3 * MiB <= budget.limit(0)
    totals = p.totals()
    assert totals[(0, "batches", "layers.1")]["write_home"] == 2 * MiB
    assert totals[(0, "batches", "layers.0")]["drop"] == MiB
    assert totals[(0, "batches", "(unnamed)")]["discard"] == MiB
    table = p.summary()
    assert "layers.0" in table and "layers.1" in table and "| cuda:0 | 3.0 | 3.0 |" in table


def test_outside_a_profile_nothing_is_recorded(budget):
    steps(budget)
    with torch_uvm.profile() as p:
        pass
    assert p.timeline() == []
    assert budget.take_timeline() == ([], 0)          # and the recording stopped


def test_a_profile_writes_json_and_a_plot(budget, tmp_path):
    with torch_uvm.profile() as p:
        steps(budget)
    p.to_json(str(tmp_path / "r.json"))
    data = json.loads((tmp_path / "r.json").read_text())
    assert len(data["events"]) == 6 and data["peaks"]["cuda:0"] == 3 * MiB
    assert data["limits"]["cuda:0"] == 3 * MiB
    pytest.importorskip("matplotlib")
    p.plot(str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_a_plot_without_matplotlib_says_how_to_get_it(budget, tmp_path, monkeypatch):
    with torch_uvm.profile() as p:
        steps(budget)
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import fails
    with pytest.raises(RuntimeError, match="needs matplotlib: pip install matplotlib"):
        p.plot(str(tmp_path / "r.png"))
    assert not (tmp_path / "r.png").exists()


def test_profile_bad_input_and_overflow(budget):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="capacity"):
            torch_uvm.profile(bad)
    with torch_uvm.profile():
        with pytest.raises(RuntimeError, match="already recording"):
            with torch_uvm.profile():
                pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_uvm.profile(capacity=2) as p:
            steps(budget)
    assert p.dropped == 4 and [e["kind"] for e in p.timeline()] == ["write_home", "discard"]
    assert any("dropped" in str(w.message) for w in caught)


def test_the_timeline_merges_into_a_torch_profiler_trace_on_its_clock(budget, tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch_uvm.profile() as p:
            torch.ones(8).add_(1)
            steps(budget)
            torch.ones(8).mul_(2)
    theirs = tmp_path / "torch.json"
    prof.export_chrome_trace(str(theirs))
    merged = tmp_path / "merged.json"
    p.export_chrome_trace(str(merged), merge_with=str(theirs))
    events = json.loads(merged.read_text())["traceEvents"]
    ours = [e for e in events if e.get("pid") == "torch_uvm"]
    assert len([e for e in ours if e["ph"] == "C"]) == 2 * 6
    assert sorted(e["name"] for e in ours if e["ph"] == "i") == [
        "torch_uvm discard ", "torch_uvm drop layers.0", "torch_uvm write_home layers.1"]
    # on torch's clock: between the ops that ran before and after the steps
    ops = {e["name"]: e for e in events if e.get("name") in ("aten::add_", "aten::mul_")}
    first, last = min(e["ts"] for e in ours), max(e["ts"] for e in ours)
    assert ops["aten::add_"]["ts"] - 1e3 <= first <= last <= ops["aten::mul_"]["ts"] + 1e3
    p.export_chrome_trace(str(tmp_path / "alone.json"))        # or a trace of its own
    alone = json.loads((tmp_path / "alone.json").read_text())["traceEvents"]
    assert len(alone) == len(ours) and min(e["ts"] for e in alone) >= 0


# --- the driver's counters (their GPU tests: test_gpu_profile.py) -------------

def driver_profile():
    """A profile holding driver events as um_counters_stop names them."""
    p = torch_uvm.profile(names={})
    p.counters_missing = None
    p.driver = [
        {"kind": "to_gpu", "cause": "prefetch", "address": A, "value": 2 * MiB, "time_s": 0.0,
         "end_s": 0.002, "device": 0, "pieces": [("x", MiB), ("y", MiB)]},
        {"kind": "to_gpu", "cause": "fault", "address": C, "value": MiB, "time_s": 0.01,
         "end_s": 0.011, "device": 0, "pieces": [("", MiB)]},
        {"kind": "gpu_fault", "cause": "unknown", "address": C, "value": 3, "time_s": 0.009,
         "end_s": 0.0095, "device": 0, "pieces": [("", 3)]},
        {"kind": "to_host", "cause": "eviction", "address": A, "value": MiB, "time_s": 0.02,
         "end_s": 0.021, "device": 0, "pieces": [("x", MiB)]},
    ]
    return p


def test_the_driver_totals_add_up_per_name_and_cause():
    totals = driver_profile().driver_totals()
    assert totals["x"]["to_gpu_bytes"] == totals["x"]["prefetched_bytes"] == MiB
    assert totals["x"]["to_host_bytes"] == totals["x"]["evicted_bytes"] == MiB
    assert totals["y"]["to_gpu_bytes"] == MiB and totals["y"]["to_host_bytes"] == 0
    unnamed = totals["(unnamed)"]
    assert unnamed["to_gpu_bytes"] == MiB and unnamed["prefetched_bytes"] == 0
    assert unnamed["gpu_faults"] == 3
    assert totals["x"]["migration_s"] == pytest.approx(0.001 + 0.001)   # half of 2 ms, then 1 ms
    table = driver_profile().summary()
    assert "What the driver moved" in table and "| x | 1.0 | 1.0 | 1.0 | 1.0 | 0 |" in table


def test_the_driver_events_become_spans_and_instants_in_a_trace(tmp_path):
    p = driver_profile()
    p.export_chrome_trace(str(tmp_path / "t.json"))
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    assert [e["name"] for e in spans] == ["to_gpu prefetch x, y", "to_gpu fault (unnamed)",
                                          "to_host eviction x"]
    assert spans[0]["dur"] == pytest.approx(2000) and spans[2]["tid"] == 2
    assert [e["name"] for e in events if e.get("ph") == "i"] == ["gpu_fault (unnamed)"]
    p.to_json(str(tmp_path / "p.json"))
    data = json.loads((tmp_path / "p.json").read_text())
    assert len(data["driver_events"]) == 4 and data["driver_totals"]["y"]["to_gpu_bytes"] == MiB
    pytest.importorskip("matplotlib")
    p.plot(str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_profile_names_and_counters_are_checked():
    import torch
    with pytest.raises(TypeError, match="names must be a module or a dict"):
        torch_uvm.profile(names=[torch.ones(2)])
    with pytest.raises(TypeError, match=r"names\['w'\] is a int"):
        torch_uvm.profile(names={"w": 3})
    with pytest.raises(TypeError, match="counters must be True or False"):
        torch_uvm.profile(counters=1)
    with pytest.raises(TypeError, match="expected tensors"):
        with torch_uvm.expect_no_gpu_faults("x"):
            pass
    model = torch.nn.Linear(2, 2)
    p = torch_uvm.profile(names=model)
    assert sorted(name for _, _, name in p._names) == ["bias", "weight"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without a GPU")
def test_without_a_gpu_the_counters_are_missing_quietly_and_checks_refuse():
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch_uvm.profile() as p:
            pass
    assert p.counters_missing == "no CUDA device"
    assert "were not recorded: no CUDA device" in p.summary()
    with pytest.raises(RuntimeError, match="not recorded"):
        p.moved(torch.ones(2))
    with pytest.raises(RuntimeError, match="not recorded"):
        with torch_uvm.expect_no_gpu_faults(torch.ones(2)):
            pass
    with torch_uvm.profile(counters=False) as off:
        pass
    with pytest.raises(RuntimeError, match="counters=False"):
        off.gpu_faults()


def test_a_fault_counts_for_a_tensor_anywhere_on_its_page():
    """The driver reports a fault at the base of the page that faulted: a
    tensor that starts inside that page was hit too."""
    import torch
    t = torch.ones(4096)[3:]                              # starts 12 bytes into its storage
    base = t.data_ptr() // 4096 * 4096
    p = driver_profile()
    fault = {"kind": "gpu_fault", "cause": "unknown", "value": 2, "time_s": 0.0,
             "end_s": 0.0, "device": 0, "pieces": [("", 2)]}
    p.driver = [dict(fault, address=base), dict(fault, address=base - 4096)]
    assert t.data_ptr() % 4096 != 0 and p.moved(t)["gpu_faults"] == 2   # not the page before
    assert p.gpu_faults(t) == 2 and p.gpu_faults() == 4


def test_a_gpu_without_some_optional_counters_says_which_and_records_the_others(monkeypatch):
    """The driver's counters start with the optional ones it lacks dropped
    (runtime/um_counters.cpp: UmCounters::start); the profile says which, and
    what was recorded is kept. The GPU and CUPTI are stood in for."""
    import time
    import torch
    given = []

    def stop(names):
        given.append(names)
        now = time.monotonic_ns()
        moved = {"kind": "to_gpu", "cause": "prefetch", "address": A, "value": MiB,
                 "start_ns": now, "end_ns": now + 1000, "device": 0, "pieces": [("x", MiB)]}
        return [moved], 0, "thrashing, throttling, remote_map, gpu_to_gpu", 0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_C, "allocator_created", lambda: False)
    monkeypatch.setattr(_C, "um_counters_start", lambda: "")
    monkeypatch.setattr(_C, "um_counters_stop", stop)
    with pytest.warns(UserWarning) as caught:
        with torch_uvm.profile() as p:
            pass
    said = [str(w.message) for w in caught]
    assert said == ["torch_uvm.profile: this GPU does not report: thrashing, throttling, "
                    "remote_map, gpu_to_gpu"], said
    assert len(given) == 1 and p.counters_missing is None
    assert [e["kind"] for e in p.driver_events()] == ["to_gpu"]
    assert p.driver_totals()["x"]["prefetched_bytes"] == MiB
