"""Sizes as people write them (torch_uvm/sizes.py), and the calls that take
them, without a GPU."""
import pytest

from torch_uvm.activations import offload_activations
from torch_uvm.sizes import parse_bytes

GiB, MiB = 1 << 30, 1 << 20


@pytest.mark.parametrize("text, nbytes", [
    ("20GiB", 20 * GiB), ("512MB", 512 * 10**6), ("1.5 GiB", 3 * GiB // 2), (" 2 kib ", 2048),
    (".5GiB", GiB // 2), ("4096", 4096), ("4096B", 4096), ("1TB", 10**12), ("2KB", 2000),
    ("1 MiB", MiB), ("4.1GB", 4_100_000_000), ("33.3MB", 33_300_000)])
def test_a_size_with_its_unit_is_its_bytes(text, nbytes):
    assert parse_bytes(text, "the budget") == nbytes


@pytest.mark.parametrize("value", [7, None, 0.5, True])
def test_what_is_not_a_string_is_left_to_the_caller(value):
    assert parse_bytes(value, "the budget") is value


@pytest.mark.parametrize("text", ["20G", "1 gigabyte", "GiB", "-1GiB", "1e3MB", "", "1.2.3 MB",
                                  "0.5", "1.0"])
def test_a_string_that_is_no_size_names_what_and_the_forms(text):
    with pytest.raises(ValueError, match=r"the budget must be bytes.*'20GiB', '512MB'.*powers "
                                         r"of 1024.*" + repr(text).replace(".", r"\.")):
        parse_bytes(text, "the budget")


def test_offload_activations_takes_sizes():
    saver = offload_activations(min_bytes="1MiB", window="512MiB", budget="2GiB")
    assert (saver.min_bytes, saver.window, saver.budget) == (MiB, 512 * MiB, 2 * GiB)
    with pytest.raises(ValueError, match="offload_activations' window must be bytes"):
        offload_activations(window="a lot")


def test_a_fraction_is_of_the_whole_the_caller_names_and_bad_ones_are_named():
    """One owner for "bytes, or a fraction of a whole" (the cap, the
    residency limit, the budget): the whole is asked for only for a fraction."""
    from torch_uvm.sizes import bytes_or_fraction
    asked = []

    def whole():
        asked.append(1)
        return 8 * GiB
    assert bytes_or_fraction("2GiB", "budget", whole) == 2 * GiB and not asked
    assert bytes_or_fraction(None, "budget", whole) is None and not asked
    assert bytes_or_fraction(0.25, "budget", whole) == 2 * GiB and asked
    assert bytes_or_fraction(1.0, "budget", 1000) == 1000
    for bad, error, match in [(1.5, ValueError, r"fractional budget must be in \(0, 1\]"),
                              (0.0, ValueError, r"fractional budget"),
                              (0, ValueError, "the budget must be positive"),
                              (-5, ValueError, "the budget must be positive"),
                              ([1], TypeError, r"the budget must be bytes .* or a fraction"),
                              (True, TypeError, "the budget must be bytes"),
                              ("20G", ValueError, "the budget must be bytes: an int")]:
        with pytest.raises(error, match=match):
            bytes_or_fraction(bad, "budget", whole)
