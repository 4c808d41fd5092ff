"""A few fixed seeds of the random differential test in the GPU suite:
offloaded training against all resident, bit for bit, on drawn models and
loops (differential.py). scripts/differential.py runs hundreds."""
import pytest
import torch

from conftest import gpu
from differential import check, program
from offload_helpers import nothing_left_streamed  # noqa: F401 (autouse)

pytestmark = gpu
# Drawn to span the features: BatchNorm and buffers written in forward, tied
# and shared weights, blocks as units, both steps, every mode.
SEEDS = [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_drawn_program_trains_offloaded_as_all_resident(uvm, seed):
    check(program(seed))
