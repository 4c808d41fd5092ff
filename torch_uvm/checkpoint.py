"""Weights read from safetensors files straight into their pinned homes:
``offload(model, checkpoint=...)`` of a model built without its weights (on
the meta device, or under accelerate's ``init_empty_weights``) reads each
tensor's bytes from the file into the pinned host memory it streams from.
The host never holds a second copy of the weights: no model on the CPU
first, no memory map of the file (whose pages would count in the process's
resident memory beside the homes), only each home as it fills.

The format (https://huggingface.co/docs/safetensors): an 8-byte
little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range after the header, then the bytes. The safetensors
library reads a tensor only into memory of its own; reading into a given
buffer (the home) needs the byte ranges, so the header is read here and the
library is the tests' reference."""
from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import struct
from typing import Dict, List, Tuple

import torch

# safetensors' dtype names
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    # in recent PyTorch only: None where this one lacks them
    "U16": getattr(torch, "uint16", None), "U32": getattr(torch, "uint32", None),
    "U64": getattr(torch, "uint64", None), "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None),
    "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
}
HEADER_MAX = 100 << 20        # the format's own limit on the header's size
CHUNK = 64 << 20              # bytes read a call
READERS = 4                   # threads reading while the next homes are pinned



class Entry:
    """One tensor in a checkpoint: its file, name, dtype, shape and byte range."""
    __slots__ = ("path", "name", "dtype", "shape", "begin", "end")

    def __init__(self, path: str, name: str, dtype: torch.dtype, shape: Tuple[int, ...],
                 begin: int, end: int):
        self.path, self.name, self.dtype, self.shape = path, name, dtype, shape
        self.begin, self.end = begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _files(checkpoint) -> List[str]:
    """The .safetensors files of `checkpoint`: one file, a list of them, or a
    folder (the files its model.safetensors.index.json names, else all its
    *.safetensors)."""
    if isinstance(checkpoint, (str, os.PathLike)):
        path = os.fspath(checkpoint)
        if os.path.isdir(path):
            index = os.path.join(path, "model.safetensors.index.json")
            if os.path.isfile(index):
                with open(index) as f:
                    names = sorted(set(json.load(f).get("weight_map", {}).values()))
            else:
                names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
            if not names:
                raise ValueError(f"torch_uvm: the checkpoint folder {path!r} has no .safetensors "
                                 "files. Pass a folder, a file or a list of .safetensors files")
            files = [os.path.join(path, n) for n in names]
        else:
            files = [path]
    elif isinstance(checkpoint, (list, tuple)) and checkpoint:
        files = [os.fspath(p) for p in checkpoint]
    else:
        raise TypeError("torch_uvm: checkpoint= takes a .safetensors file, a folder of them or a "
                        f"list of them, got {type(checkpoint).__name__}")
    missing = [p for p in files if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"torch_uvm: checkpoint file(s) not found: {', '.join(missing)}")
    return files


def read_header(path: str) -> Dict[str, Entry]:
    """Each tensor of one safetensors file, by name; a clear ValueError if the
    file is not one."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(HEADER_MAX, size - 8):
            raise ValueError(f"torch_uvm: {path!r} is not a safetensors file (its first 8 bytes "
                             "do not give a header length that fits the file)")
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise ValueError(f"torch_uvm: {path!r} is not a safetensors file: its header is not "
                             f"JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"torch_uvm: {path!r} is not a safetensors file: its header is not a "
                         f"JSON object but a {type(header).__name__}")
    start = 8 + length
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (start + int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            dtype = None
        if dtype is not None and any(d < 0 for d in shape):
            dtype = None
        if dtype is None:
            raise ValueError(f"torch_uvm: {path!r}: tensor {name!r} has a dtype or layout this "
                             f"reader does not know: {info!r}")
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * dtype.itemsize or end > size or begin < start:
            raise ValueError(f"torch_uvm: {path!r}: tensor {name!r}'s bytes ({begin}..{end}) do "
                             f"not match its shape {list(shape)} and dtype {info['dtype']}, or "
                             "lie outside the file: the file is damaged or truncated")
        entries[name] = Entry(path, name, dtype, shape, begin, end)
    return entries


def read_checkpoint(checkpoint) -> Dict[str, Entry]:
    """Every tensor of the checkpoint's files, by name."""
    entries: Dict[str, Entry] = {}
    for path in _files(checkpoint):
        for name, e in read_header(path).items():
            if name in entries:
                raise ValueError(f"torch_uvm: tensor {name!r} is in two checkpoint files: "
                                 f"{entries[name].path!r} and {path!r}")
            entries[name] = e
    return entries


def match(entries: Dict[str, Entry], names: Dict[int, List[str]],
          tensors: Dict[int, torch.Tensor]) -> Dict[int, Entry]:
    """Which entry gives each tensor its value (a tied tensor, with several
    names, by the first of them the checkpoint has), checked before anything
    is read: every tensor on the meta device needs one, and each found must
    have the tensor's shape. A clear ValueError names what is wrong."""
    found: Dict[int, Entry] = {}
    for i, ns in names.items():
        hit = next((n for n in ns if n in entries), None)
        if hit is not None:
            found[i] = entries[hit]
            t, e = tensors[i], entries[hit]
            if tuple(t.shape) != e.shape:
                raise ValueError(f"torch_uvm: '{hit}' is {list(e.shape)} in the checkpoint "
                                 f"({e.path}) and {list(t.shape)} in the module: the checkpoint "
                                 "is of another model or configuration")
    missing = [ns[0] for i, ns in names.items() if tensors[i].is_meta and i not in found]
    if missing:
        known = set(n for ns in names.values() for n in ns)
        unused = sorted(n for n in entries if n not in known)
        raise ValueError(
            f"torch_uvm: the module's {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
            f"({len(missing)} in all) are on the meta device and not in the checkpoint"
            + (f", which has {', '.join(unused[:4])}{' ...' if len(unused) > 4 else ''} unused "
               "(another prefix?)" if unused else "")
            + ". A buffer the model does not save (rotary inv_freq) needs a value before offload: "
              "build the model under accelerate's init_empty_weights(), which keeps buffers, or "
              "give it one")
    return found


def _bytes_of(t: torch.Tensor):
    """A writable buffer over a contiguous CPU tensor's bytes."""
    return (ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())


def read_into(entry: Entry, out: torch.Tensor) -> None:
    """The entry's value into `out`, a contiguous CPU tensor of its shape."""
    with open(entry.path, "rb", buffering=0) as f:
        _read(entry, out, f)


def _read(entry: Entry, out: torch.Tensor, f) -> None:
    """`entry`'s bytes from the open file `f` into `out`: straight into it
    where the dtypes agree; else CHUNK bytes at a time into a buffer, each
    cast into its part of `out` (the host holds no whole second copy)."""
    flat = out.view(-1)
    step = max(CHUNK // entry.dtype.itemsize, 1)       # elements a read
    buffer = None if out.dtype == entry.dtype else torch.empty(
        min(step, flat.numel()), dtype=entry.dtype)
    for first in range(0, flat.numel(), step):
        part = flat[first:first + step]
        into = part if buffer is None else buffer[:part.numel()]
        view = memoryview(_bytes_of(into)).cast("B")
        offset, done = entry.begin + first * entry.dtype.itemsize, 0
        while done < len(view):
            n = os.preadv(f.fileno(), [view[done:]], offset + done)
            if n <= 0:
                raise OSError(f"torch_uvm: {entry.path!r} ended early, reading at byte "
                              f"{offset + done}: the file is truncated")
            done += n
        if buffer is not None:
            part.copy_(into)


class Reader:
    """Reads entries into given tensors on READERS threads (a read releases
    the GIL). `close()` waits for every read (call it before the memory read
    into is freed, an error's path included: `close(failed=True)`) and
    raises the first that failed."""

    def __init__(self, threads: int = READERS):
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "torch_uvm-read")
        self._files: dict = {}
        self._pending: list = []

    def submit(self, entry: Entry, out: torch.Tensor, done=None) -> None:
        """`done(nbytes)`, if given, is called on the reading thread once the
        read succeeded (a progress bar's count)."""
        f = self._files.get(entry.path)
        if f is None:
            f = self._files[entry.path] = open(entry.path, "rb", buffering=0)
        read = self._pool.submit(_read, entry, out, f)
        if done is not None:
            nbytes = out.numel() * out.element_size()
            read.add_done_callback(
                lambda r: done(nbytes) if not r.cancelled() and r.exception() is None else None)
        self._pending.append(read)

    def close(self, failed: bool = False) -> None:
        """Waits for every read. `failed`: the caller is raising already;
        reads not begun are dropped, and the reads' own failures are not
        raised over the caller's."""
        try:
            if failed:
                for queued in self._pending:
                    queued.cancel()
                concurrent.futures.wait(self._pending)
            else:
                for done in self._pending:
                    done.result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pending.clear()
            for f in self._files.values():
                f.close()
            self._files.clear()


# PEFT wraps the base model: "base_model.model." before its names, and
# ".base_layer" inside each layer it adapts. A base model's checkpoint names
# the same tensors without them.
PEFT_PREFIX, PEFT_LAYER = "base_model.model.", ".base_layer."


def base_name(name: str) -> str:
    """`name` as the base model's checkpoint spells it (PEFT's wrappers
    left out); `name` itself if nothing wraps it."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):]
    return name.replace(PEFT_LAYER, ".")


def names_by_tensor(module: torch.nn.Module) -> Dict[int, List[str]]:
    """Every name (as state_dict and checkpoints spell it) of each of the
    module's parameters and buffers, by the tensor's id: a tied tensor has
    several. A PEFT model's tensors also go by their base model's names,
    after their own: a base model's checkpoint loads into it."""
    names: Dict[int, List[str]] = {}
    for mname, m in module.named_modules(remove_duplicate=False):
        for kind in (m._parameters, m._buffers):
            for tname, t in kind.items():
                if t is not None:
                    full = f"{mname}.{tname}" if mname else tname
                    if full not in names.setdefault(id(t), []):
                        names[id(t)].append(full)
    for ns in names.values():
        ns += [b for b in dict.fromkeys(base_name(n) for n in ns) if b not in ns]
    return names
