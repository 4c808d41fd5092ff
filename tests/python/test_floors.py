"""benchmarks/floors.py: the least step at the rates measured together, with
its phases, each checked by hand on a small case (docs/design.md, "The
floors")."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
pytest.importorskip("scipy")

import floors  # noqa: E402


def rates(h2d=50.0, d2h=50.0, both=(40.0, 40.0), adamw=1e30, beside=(40.0, 40.0, 1e30)):
    """A run's measured rates in pinned_rate's keys (GB/s, elements/s)."""
    return {"h2d_gbps": h2d, "d2h_gbps": d2h, "both_ways_h2d_gbps": both[0],
            "both_ways_d2h_gbps": both[1], "adamw_alone_elements_per_s": adamw,
            "h2d_beside_adamw_gbps": beside[0], "d2h_beside_adamw_gbps": beside[1],
            "adamw_beside_copies_elements_per_s": beside[2]}


def only(name, **kwargs):
    return {name: floors.placements(**kwargs)[name]}


STREAMED = "streamed, host step"


def test_the_placements_by_hand():
    """Per weight byte: to the GPU, home, host-stepped, budget, host memory,
    the forward's reads, the backward's reads."""
    fp32 = floors.placements()
    assert fp32 == {                                      # ... and the states a GPU step brings
        "streamed, host step": (2, 1, 1, 0, 7, 1, 1, 0),
        "streamed, GPU step": (4, 3, 0, 0, 0, 1, 1, 2),   # AdamW's moments both ways
        "resident, host step": (1, 1, 1, 1, 7, 0, 0, 0),
        "resident, GPU step": (2, 2, 0, 1, 0, 0, 0, 2),
        "resident with states": (0, 0, 0, 3, 0, 0, 0, 0)}
    casts = floors.placements(casts=True)
    assert casts["streamed casts, host step"] == (1, 0.5, 1, 0, 10, 0.5, 0.5, 0)
    # fp32 in for its step; the next forward's cast home beside the stepped weight
    assert casts["streamed, GPU step"] == (3.5, 3.5, 0, 0, 0, 0.5, 1, 2)
    assert casts["resident cast, host step"] == (0.5, 0.5, 1, 0.5, 10, 0, 0, 0)
    eight = floors.placements(states=0.5)                # 8-bit moments: a byte each
    assert eight["streamed, GPU step"][:2] == (2.5, 1.5)
    assert eight["resident, GPU step"][:2] == (0.5, 0.5)
    assert eight["resident with states"][3] == 1.5
    with pytest.raises(ValueError, match="states must be >= 0"):
        floors.placements(states=-1)


def test_both_ways_at_their_shared_rates():
    """Streamed weights stepped on a host that is free: 2W in and W home.
    Both ways at 40 GB/s carry W each, and the second W in goes alone at 50:
    W/40 + W/50. The solo rates at once would give 2W/50."""
    w = 4e9
    got = floors.least_step_together_s(w, 0, rates(), ways=only(STREAMED))
    assert got["seconds"] == pytest.approx(w / 40e9 + w / 50e9, rel=1e-6)
    assert got["regime_seconds"]  # (which regimes: the solver's choice among equals)


def test_the_hosts_step_beside_the_copies_at_their_shared_rates():
    """Resident weights stepped on the host (W in, W home, W/4 elements).
    The AdamW alone steps 1e9 elements/s. Beside both copies it steps 0.75e9,
    and the copies then run at 20 GB/s. Host-bound: all three run while
    the copies last (W/20 s), and the AdamW alone does the rest:
    W/20 + (n - 0.75e9 W/20) / 1e9 = W/80 + n/1e9."""
    w, n = 8e9, 2e9
    r = rates(adamw=1e9, beside=(20.0, 20.0, 0.75e9))
    got = floors.least_step_together_s(w, w, r, ways=only("resident, host step"))
    assert got["seconds"] == pytest.approx(w / 80e9 + n / 1e9, rel=1e-6)     # 2.1 s
    # each at its solo rate, all at once: the host alone, 2.0 s
    assert got["seconds"] > max(w / 50e9, n / 1e9)


def test_the_forward_carries_no_step_without_carry():
    """Streamed, host-stepped, copies without contention (50 GB/s each way
    in every regime), an AdamW of 1e9 elements/s beside them: the reads take
    0.1 s in each pass, the host 1.25 s. With carry, the host steps through
    every phase: 1.25 s. Without carry, the host steps nothing during the
    forward: 0.1 + 1.25 s."""
    w = 5e9
    r = rates(both=(50.0, 50.0), adamw=1e9, beside=(50.0, 50.0, 1e9))
    carried = floors.least_step_together_s(w, 0, r, ways=only(STREAMED))
    assert carried["seconds"] == pytest.approx(1.25, rel=1e-6)
    held = floors.least_step_together_s(w, 0, r, ways=only(STREAMED), carry=False)
    assert held["seconds"] == pytest.approx(0.1 + 1.25, rel=1e-6)
    assert held["phase_seconds"]["forward"] == pytest.approx(0.1, rel=1e-6)


def test_without_carry_the_stepped_weights_and_their_gradients_wait_for_the_backward():
    """Resident weights stepped on a free host (W in, W home), home ten times
    the link's 50 GB/s to the GPU: without carry, the stepped weights come
    back after the forward, whose 1 s of compute then carries none of them:
    1 + W/50. With carry, they come in the forward: 1 s. A GPU step's states
    (2W in, 2W home) need no gradient: they come in the forward either way,
    and only their copies home wait: 1 + 2W/500."""
    w = 10e9
    r = rates(d2h=500.0, both=(50.0, 500.0), beside=(50.0, 500.0, 1e30))
    common = dict(compute_s=(1.0, 0.0), ways=only("resident, host step"))
    assert floors.least_step_together_s(w, w, r, **common)["seconds"] == pytest.approx(
        1.0, rel=1e-6)
    assert floors.least_step_together_s(w, w, r, carry=False, **common)["seconds"] == \
        pytest.approx(1.0 + w / 50e9, rel=1e-6)
    gpu = floors.least_step_together_s(w, 3 * w, r, compute_s=(1.0, 0.0), carry=False,
                                       ways=only("resident, GPU step"))
    assert gpu["seconds"] == pytest.approx(1.0 + 2 * w / 500e9, rel=1e-6)


def test_a_cast_stepped_on_the_host_costs_its_cast_and_upcast_there():
    """The host's AdamW at 1e9 elements/s alone: an fp32 weight stepped there
    takes W/4 elements; its cast and upcast add 12 bytes to AdamW's 28 a
    weight, so a cast one takes 40/28 as long."""
    w = 4e9
    r = rates(adamw=1e9, beside=(40.0, 40.0, 1e9))
    fp32 = floors.least_step_together_s(w, w, r, ways=only("resident, host step"))
    cast = floors.least_step_together_s(w, w, r, ways=only("resident cast, host step",
                                                            casts=True))
    assert fp32["seconds"] == pytest.approx(w / 4 / 1e9, rel=1e-6)
    assert cast["seconds"] == pytest.approx(w / 4 / 1e9 * 40 / 28, rel=1e-6)


def test_the_gpus_compute_bounds_each_phase():
    """Copies and steps that fit within the compute: the forward's 0.3 s and
    the backward's 0.6 s. A forward shorter than its reads (0.01 s for 0.1 s
    of reads) takes the reads' time."""
    w = 5e9
    got = floors.least_step_together_s(w, 0, rates(), compute_s=(0.3, 0.6), ways=only(STREAMED))
    assert got["seconds"] == pytest.approx(0.9, rel=1e-6)
    short = floors.least_step_together_s(w, 0, rates(both=(50.0, 50.0),
                                                     beside=(50.0, 50.0, 1e30)),
                                         compute_s=(0.01, 1.0), ways=only(STREAMED))
    assert short["phase_seconds"]["forward"] == pytest.approx(0.1, rel=1e-6)
    assert short["seconds"] == pytest.approx(1.1, rel=1e-6)


def test_eight_bit_states_cross_less_for_a_gpu_step():
    """A host too slow to step (1 element/s): every weight steps on the GPU,
    streamed with its states. With 8-bit states, 2.5W in and 1.5W home:
    2.5W/50. AdamW's fp32 moments: 4W/50."""
    w = 2e9
    slow = rates(both=(50.0, 50.0), adamw=1.0, beside=(50.0, 50.0, 1.0))
    eight = floors.least_step_together_s(w, 0, slow, ways=floors.placements(states=0.5))
    fp32 = floors.least_step_together_s(w, 0, slow)
    assert eight["seconds"] == pytest.approx(2.5 * w / 50e9, rel=1e-6)
    assert fp32["seconds"] == pytest.approx(4 * w / 50e9, rel=1e-6)
    # enough budget for all weights and their 8-bit states: nothing crosses
    assert floors.least_step_together_s(w, int(1.5 * w), slow, ways=floors.placements(
        states=0.5))["seconds"] == pytest.approx(0, abs=1e-9)


def test_a_run_that_did_not_measure_the_shared_rates_is_named():
    with pytest.raises(KeyError, match="both_ways_h2d_gbps"):
        floors.least_step_together_s(1e9, 0, {"h2d_gbps": 50.0, "d2h_gbps": 50.0})
