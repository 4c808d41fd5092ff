"""Sizes as people write them. Every torch_uvm call that takes bytes (a
budget, the cap, the residency limit, the release threshold, the
activations' sizes) takes an int of bytes or a string with a unit:
``"20GiB"``, ``"512MB"``, ``"1.5 GiB"``. GiB, MiB and KiB are powers of
1024; GB, MB and kB powers of 1000, as accelerate's ``max_memory`` and the
SI write them. A float in (0, 1] is a fraction of a whole each call names
(bytes_or_fraction): the cap's of the free device memory seen at start, the
residency limit's of the cap, a budget's of the GPU's residency limit (of
the cap without one). The process's GPU memory (gpu_memory) also takes a
fraction of the card's whole memory and "auto" (card_bytes)."""
from __future__ import annotations

import re
from decimal import Decimal

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_bytes(value, what: str):
    """`value` in bytes, if it is a string: a number with a unit (rounded
    down to a whole byte), or a whole number of bytes without one; any other value as it is, for the caller to check. A string
    that is no size raises ValueError naming `what` and the forms taken."""
    if not isinstance(value, str):
        return value
    found = _SIZE.match(value)
    if found is None or found.group(2).lower() not in UNITS or \
            (found.group(2) == "" and not found.group(1).isdigit()):   # "0.5": a fraction?
        raise ValueError(
            f"torch_uvm: {what} must be bytes: an int, or a size with its unit such as "
            f"'20GiB', '512MB' or '1.5 GiB' (GiB, MiB, KiB: powers of 1024; GB, MB, kB: of "
            f"1000); got {value!r}")
    number, unit = found.groups()
    return int(Decimal(number) * UNITS[unit.lower()])   # (exact: "4.1GB" is 4100000000)


def bytes_or_fraction(value, what: str, whole):
    """`value` in bytes where a float in (0, 1] is that fraction of `whole`
    (bytes, or a function giving them, asked only for a fraction: each
    caller says which whole), an int or a size string as parse_bytes takes
    it, None as it is. Raises TypeError for a value of no such kind and
    ValueError for a fraction outside (0, 1] or bytes not positive, each
    naming `what` ("cap", "residency limit", "budget")."""
    value = parse_bytes(value, f"the {what}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"torch_uvm: the {what} must be bytes (an int, or a size such as "
                        f"'20GiB') or a fraction (a float in (0, 1]), got {value!r}")
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"torch_uvm: a fractional {what} must be in (0, 1], got {value}")
        value = int(value * (whole() if callable(whole) else whole))
    if value <= 0:
        raise ValueError(f"torch_uvm: the {what} must be positive, got {value}")
    return value


AUTO_HEADROOM = 0.05     # "auto" leaves this share of the card to the driver and others


def card_bytes(value, what: str, device=None):
    """The GPU memory a process may take, as people write it: bytes (an int,
    or a size string as parse_bytes takes it), a float in (0, 1] (that
    fraction of the card's whole memory), or "auto" (the card's memory less
    AUTO_HEADROOM of it, and less what other processes hold there now is
    not told apart: the card is taken to be this process's); None as it
    is. A fraction or "auto" reads the card (`device`, default the current
    one), and without a GPU is refused by name."""
    if value is None:
        return None
    auto = isinstance(value, str) and value.strip().lower() == "auto"
    if auto or isinstance(value, float):
        import torch
        if not torch.cuda.is_available():
            raise ValueError(f"torch_uvm: {what}={value!r} reads the card's memory, and there "
                             f"is no GPU here: name a size such as '24GiB'")
        total = torch.cuda.mem_get_info(device)[1]
        if auto:
            return int(total * (1 - AUTO_HEADROOM))
    else:
        total = None
    try:
        return bytes_or_fraction(value, what, total)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{err} (or 'auto': what the card can give)") from None
