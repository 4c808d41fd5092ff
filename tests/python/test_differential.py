"""The random differential test's programs, without a GPU: each seed draws
the same program every time, every program runs all resident on the CPU,
the seeds cover every feature, action and setting, and the comparison
finds a single changed value. test_gpu_differential.py runs programs
offloaded against all resident on the GPU; scripts/differential.py runs
hundreds."""
import math

import pytest
import torch

from differential import (ACTIONS, FEATURES, differences, everything, load, program,
                          run_resident)

SEEDS = range(300)


def test_a_seed_draws_the_same_program_each_time():
    assert program(11) == program(11)
    assert program(11) != program(12)


@pytest.mark.parametrize("seed", range(0, 300, 10))
def test_every_program_runs_all_resident_on_the_cpu(seed):
    got, _ = run_resident(load(program(seed)), device="cpu")
    losses = [v for v in got if isinstance(v, torch.Tensor) and v.dim() == 0]
    assert losses and all(math.isfinite(v.item()) for v in losses)


def test_the_seeds_cover_every_feature_action_and_setting():
    texts = [program(s) for s in SEEDS]
    firsts = " ".join(t.splitlines()[0] for t in texts)
    for word in FEATURES + ACTIONS:
        assert word in firsts, word
    settings = [load(t)["SETTINGS"] for t in texts[:120]]
    for key, values in [("mode", {"auto", "in_place", "prefetch"}),
                        ("step_in_backward", {True, False}), ("ahead", {1, 2}),
                        ("optimizer", {"AdamW", "Adam", "SGD"}), ("units", {None, "Block"})]:
        assert {s[key] for s in settings} == values, key
    fractions = {s["budget_fraction"] for s in settings}
    assert {0.0, 1.0} <= fractions and len(fractions) > 10     # the least, the whole, between


def test_a_step_in_backward_program_never_clips_nor_accumulates():
    """(PyTorch's clipping of gradients stepped in backward raises, and a
    second backward before step() does: both are refusals, tested apart)"""
    for s in SEEDS:
        names = load(program(s))
        if names["SETTINGS"]["step_in_backward"]:
            text = program(s)
            assert "clip_grad_norm_" not in text and "/ 2).backward()" not in text


def test_the_comparison_finds_one_changed_value():
    names = load(program(3))
    model = names["build"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    want = everything(model, optimizer)
    assert differences(everything(model, optimizer), want, "") == []
    buffer = next(model.buffers(), None) or next(model.parameters())
    with torch.no_grad():
        buffer.view(-1)[0] += 1
    assert len(differences(everything(model, optimizer), want, "")) == 1
    assert differences([torch.ones(2)], [torch.ones(2), torch.ones(2)], "x") != []
