"""How "auto" chooses between reading streamed weights in place and
prefetching them, without a GPU: the rule (offload.faster_mode) over the
bytes each would stream. The GPU tests (test_gpu_offload.py) check that
an offload follows it."""
from torch_uvm.offload import IN_PLACE_SPEED, faster_mode

MiB = 1 << 20


def test_large_submodules_read_in_place():
    # the benchmarks' 2 GiB MLP under 1 GiB, 128 MiB layers: prefetch's
    # window of two layers leaves 6 resident instead of 8
    assert faster_mode(in_place_bytes=1024 * MiB, prefetch_bytes=1280 * MiB) == "in_place"


def test_small_submodules_prefetch():
    # GPT-2-style generation under half its weights (session 16): a window of
    # two 32 MiB weights costs 72 MiB more streamed, less than the 10% that
    # reading in place loses to the link
    assert faster_mode(in_place_bytes=1565 * MiB, prefetch_bytes=1637 * MiB) == "prefetch"


def test_the_line_between_them_is_the_speed_of_reading_in_place():
    in_place = 900 * MiB
    even = int(in_place / IN_PLACE_SPEED)
    assert faster_mode(in_place, even - MiB) == "prefetch"
    assert faster_mode(in_place, even + MiB) == "in_place"
    assert faster_mode(0, 0) == "in_place"       # all resident: nothing to bring ahead
