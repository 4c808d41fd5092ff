"""How fast each way of moving a managed range is (issues 10, 12 and 20): the
measurements behind the choice of mechanism per case.

    python benchmarks/mechanisms.py [--rounds 5] [--out DIR]

One process, UVM off (managed tensors from torch_uvm.manage_memory; with
--uvm on, so that GPU tensors are managed memory on the GPU, as the streaming
engine's slots are), every variant once per round, rounds interleaved. Wall time from the first call to
the end of a synchronize, so advice and host time count.

to_gpu (pages on the CPU, 128 MiB and 1 GiB): a pinned copy; a migrating
  prefetch; a prefetch making read-mostly duplicates (with and without the
  preferred location on the CPU, as offload advised it); a copy-engine copy
  from the managed pages into device memory; a kernel reading the pages in
  place (preferred location CPU + accessed-by: zero-copy).
gemm: fp16 Linear(8192, 8192) whose weight is read in place over PCIe, batch
  16 / 128 / 1024, against the weight resident and against a pinned copy of it.
evict (128 MiB on the GPU): dropping a read-mostly duplicate, migrating back.
to_cpu (written on the GPU, then read by the CPU): a migrating prefetch (one
  call, or four pieces on four streams); a copy into pinned memory; a copy
  into CPU-resident managed memory; CPU page faults (all threads, one thread);
  and the kernel's cost of fresh pages (first touch of new pageable memory).
batch (128 MiB in 64 ranges): one call per range against CUDA 13's batch
  calls, to the GPU and back, and discarding dead data (with and without
  moving its residency to the CPU).
copy_h2d: gpu.copy_(managed cpu), .to('cuda', float16) and load_state_dict
  from managed CPU tensors: PyTorch's copy against torch_uvm's (prefetch the
  source, copy on the GPU), with a pinned source as the anchor.
copy_d2h: a GPU tensor into pinned, CPU-resident managed and pageable memory:
  PyTorch's copy, and through pinned buffers (16 MiB pieces, pipelined).
slot_h2d / slot_d2h (128 MiB, 1 GiB): a streamed tensor's home (managed pages
  on the CPU, mapped for the GPU) copied into GPU memory and written back, by
  the copy engine (whole, or in pieces on two streams) or by a kernel, against
  pinned copies.
slot_both: 1 GiB each way at once on two streams (GB/s counts both): pinned;
  homes by copy engines both ways; copy engine one way and a kernel the other;
  kernels both ways; pinned memory read and written in place by kernels.
contention: 32 fp32 GEMMs alone, and beside a fused AdamW reading its
  states in place (256 MiB of weights) or beside pinned copies both ways.
adamw (256 MiB of fp32 weights): one fused AdamW step with its two moments on
  the GPU, in homes read and written in place over PCIe, or copied in and out;
  the same with the moments in pinned memory.
"""
import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import method  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30


class CudaMemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def cudart():
    """The CUDA runtime torch loaded (by soname), with the calls used here."""
    import torch
    for name in ("libcudart.so.13", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            lib = None
    if lib is None:
        import glob
        found = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**",
                                       "libcudart.so*"), recursive=True)
        lib = ctypes.CDLL(found[0])
    lib.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, CudaMemLocation,
                                         ctypes.c_uint, ctypes.c_void_p]
    return lib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--only", default=None, help="groups whose name starts with one of these")
    ap.add_argument("--uvm", action="store_true", help="UVM on: GPU tensors are managed")
    args = ap.parse_args()
    import torch
    import torch_uvm
    from torch_uvm import _C
    if args.uvm:
        torch_uvm.set_enabled_uvm(True)
    dev = torch.device("cuda", 0)
    cpu = torch.device("cpu")
    side = torch.cuda.Stream(dev)
    sync = torch.cuda.synchronize

    def managed_on_cpu(nbytes, dtype=torch.float16):
        t = torch.empty(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype)
        t.fill_(1)
        m = torch_uvm.manage_memory(t)   # copied on the CPU: pages there
        for a in ("unset_read_mostly", "unset_preferred_location", "unset_accessed_by"):
            _C.advise(m, a, dev)          # a reused block keeps its last advice
        sync()
        return m

    def timed(fn, prepare=None):
        state = prepare() if prepare else None
        sync()
        t0 = time.perf_counter()
        fn(state) if prepare else fn()
        sync()
        return time.perf_counter() - t0

    def stock(fn):
        """fn with PyTorch's own copy_ (torch_uvm's copy_ override off)."""
        def run(*a):
            torch_uvm.set_fast_copy(False)
            try:
                return fn(*a)
            finally:
                torch_uvm.set_fast_copy(True)
        return run

    # --- to the GPU -----------------------------------------------------------
    def to_gpu_variants(nbytes):
        dst = torch.empty(nbytes // 2, dtype=torch.float16, device=dev)
        pinned = torch.ones(nbytes // 2, dtype=torch.float16).pin_memory()

        def advised(*advice):
            def prepare():
                m = managed_on_cpu(nbytes)
                for a in advice:
                    _C.advise(m, a, cpu if a == "preferred_location" else
                              dev if a == "accessed_by" else None)
                sync()
                return m
            return prepare
        return {
            "pinned_copy": (lambda: dst.copy_(pinned, non_blocking=True), None),
            "prefetch_migrate": (lambda m: _C.prefetch(m, dev, None), advised()),
            "prefetch_read_mostly": (lambda m: _C.prefetch(m, dev, None), advised("read_mostly")),
            "prefetch_read_mostly_pref_cpu": (lambda m: _C.prefetch(m, dev, None),
                                              advised("preferred_location", "read_mostly")),
            "advise_then_prefetch_read_mostly_pref_cpu": (
                lambda m: (_C.advise(m, "preferred_location", cpu),
                           _C.advise(m, "read_mostly", None), _C.prefetch(m, dev, None)),
                advised()),
            "copy_from_managed": (stock(lambda m: dst.copy_(m, non_blocking=True)), advised()),
            "copy_from_managed_pref_cpu": (stock(lambda m: dst.copy_(m, non_blocking=True)),
                                           advised("preferred_location")),
            "copy_from_managed_twice": (
                stock(lambda m: (dst.copy_(m, non_blocking=True), dst.copy_(m, non_blocking=True))),
                advised()),
            "read_in_place": (lambda m: _C.alias_on_device(m, dev).sum(),
                              advised("preferred_location", "accessed_by")),
            "read_in_place_twice": (
                lambda m: (_C.alias_on_device(m, dev).sum(), _C.alias_on_device(m, dev).sum()),
                advised("preferred_location", "accessed_by")),
        }

    # --- weights streamed over and over: bring, drop, bring again ------------
    def cycle_variants(nbytes):
        def drop(m):
            _C.advise(m, "unset_read_mostly", None)
            _C.advise(m, "read_mostly", None)

        def after(*advice, cycles=1):
            def prepare():
                m = managed_on_cpu(nbytes)
                for a in advice:
                    _C.advise(m, a, cpu if a == "preferred_location" else
                              dev if a == "accessed_by" else None)
                for _ in range(cycles):
                    _C.prefetch(m, dev, None)
                    sync()
                    drop(m)
                sync()
                return m
            return prepare

        def read(m):
            return _C.alias_on_device(m, dev).sum()
        rm = ("preferred_location", "read_mostly")
        rm_ab = rm + ("accessed_by",)
        return {
            "prefetch_after_drop": (lambda m: _C.prefetch(m, dev, None), after(*rm)),
            "prefetch_after_3_drops": (lambda m: _C.prefetch(m, dev, None), after(*rm, cycles=3)),
            "prefetch_after_drop_accessed_by": (lambda m: _C.prefetch(m, dev, None), after(*rm_ab)),
            "prefetch_never_dropped_accessed_by": (lambda m: _C.prefetch(m, dev, None),
                                                   after(*rm_ab, cycles=0)),
            # residency by timing: a read of a GPU copy runs at HBM speed
            "read_after_prefetch_accessed_by": (read, lambda: _prefetched(after(*rm_ab, cycles=0))),
            "read_after_drop_accessed_by": (read, after(*rm_ab)),
            "read_in_place_read_mostly_accessed_by": (lambda m: (read(m), read(m)),
                                                      after(*rm_ab, cycles=0)),
            "read_after_drop_no_accessed_by": (read, after(*rm)),
        }

    def _prefetched(prepare):
        m = prepare()
        _C.prefetch(m, dev, None)
        sync()
        return m

    # --- a GEMM reading its weight in place -----------------------------------
    def gemm_variants(batch):
        n = 8192
        w_dev = torch.full((n, n), 0.01, dtype=torch.float16, device=dev)
        w_pinned = torch.full((n, n), 0.01, dtype=torch.float16).pin_memory()
        x = torch.randn(batch, n, dtype=torch.float16, device=dev)
        w_managed = managed_on_cpu(n * n * 2).view(n, n)
        _C.advise(w_managed, "preferred_location", cpu)
        _C.advise(w_managed, "accessed_by", dev)
        w_alias = _C.alias_on_device(w_managed, dev)
        return {
            "resident": (lambda: torch.nn.functional.linear(x, w_dev), None),
            "pinned_copy_then_gemm": (lambda: torch.nn.functional.linear(
                x, w_dev.copy_(w_pinned, non_blocking=True)), None),
            "in_place_over_pcie": (lambda: torch.nn.functional.linear(x, w_alias), None),
        }

    # --- leaving the GPU ------------------------------------------------------
    def evict_variants(nbytes):
        def on_gpu(*advice):
            def prepare():
                m = managed_on_cpu(nbytes)
                for a in advice:
                    _C.advise(m, a, cpu if a == "preferred_location" else None)
                _C.prefetch(m, dev, None)
                sync()
                return m
            return prepare
        return {
            "drop_read_mostly_duplicate": (
                lambda m: (_C.advise(m, "unset_read_mostly", None), _C.advise(m, "read_mostly", None)),
                on_gpu("preferred_location", "read_mostly")),
            "migrate_back": (lambda m: _C.prefetch(m, cpu, None), on_gpu()),
        }

    # --- to the CPU, then read there ------------------------------------------
    def to_cpu_variants(nbytes):
        n = nbytes // 4
        pinned = torch.empty(n, dtype=torch.float32).pin_memory()
        managed_dst = torch_uvm.manage_memory(torch.zeros(n))
        home_dst = home(nbytes)
        home_cpu = _C.alias_on_device(home_dst, cpu)

        def written_on_gpu():
            m = torch_uvm.manage_memory(torch.empty(n, device=dev))
            m.fill_(2.0)                    # written by a kernel: pages on the GPU
            sync()
            return m

        def read(t):
            return float(t.sum())
        return {
            "prefetch_then_read": (
                lambda m: (_C.prefetch(m, cpu, None), sync(), read(_C.alias_on_device(m, cpu))),
                written_on_gpu),
            "copy_to_pinned_then_read": (lambda m: read(pinned.copy_(m)), written_on_gpu),
            "copy_to_managed_cpu_then_read": (lambda m: read(managed_dst.copy_(m)), written_on_gpu),
            # the copy engine writes into host-resident managed pages mapped
            # for the GPU (a streamed tensor's home): no migration
            "copy_engine_into_home_then_read": (
                stock(lambda m: (home_dst.copy_(m), sync(), read(home_cpu))), written_on_gpu),
            "cpu_faults_read": (lambda m: read(_C.alias_on_device(m, cpu)), written_on_gpu),
            "cpu_faults_read_1_thread": (
                lambda m: one_thread(lambda: read(_C.alias_on_device(m, cpu))), written_on_gpu),
            "prefetch_4_streams_then_read": (lambda m: (prefetch_pieces(m, 4), sync(),
                                                        read(_C.alias_on_device(m, cpu))),
                                             written_on_gpu),
            "read_only_pinned": (lambda: read(pinned), None),
            # the kernel's cost of giving a process fresh pages: first touch
            # of new pageable memory, one thread and all of them
            "first_touch_pageable": (lambda: torch.empty(n).fill_(1.0), None),
            "first_touch_pageable_1_thread": (
                lambda: one_thread(lambda: torch.empty(n).fill_(1.0)), None),
        }

    def one_thread(fn):
        saved = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(saved)

    side_streams = [torch.cuda.Stream(dev) for _ in range(4)]

    def prefetch_pieces(m, k):
        piece = (m.numel() + k - 1) // k
        for i, st in enumerate(side_streams[:k]):
            _C.prefetch(m[i * piece:(i + 1) * piece], cpu, st)

    # --- CUDA 13's batch calls (ctypes: torch_uvm's runtime does not use them)
    rt = cudart()

    def loc(device):
        return CudaMemLocation(2, 0) if device.type == "cpu" else CudaMemLocation(1, device.index)

    def batch_call(name, pieces, device=None):
        n = len(pieces)
        ptrs = (ctypes.c_void_p * n)(*[p.data_ptr() for p in pieces])
        sizes = (ctypes.c_size_t * n)(*[p.numel() * p.element_size() for p in pieces])
        s = ctypes.c_void_p(side.cuda_stream)
        if name == "cudaMemDiscardBatchAsync":
            err = rt.cudaMemDiscardBatchAsync(ptrs, sizes, ctypes.c_size_t(n),
                                              ctypes.c_ulonglong(0), s)
        else:
            where = (CudaMemLocation * 1)(loc(device))
            first = (ctypes.c_size_t * 1)(0)
            err = getattr(rt, name)(ptrs, sizes, ctypes.c_size_t(n), where, first,
                                    ctypes.c_size_t(1), ctypes.c_ulonglong(0), s)
        if err != 0:
            raise RuntimeError(f"{name} failed: cudaError {err}")
        side.synchronize()

    def prefetch_each(pieces, device):
        s = ctypes.c_void_p(side.cuda_stream)
        for p in pieces:
            err = rt.cudaMemPrefetchAsync(ctypes.c_void_p(p.data_ptr()),
                                          ctypes.c_size_t(p.numel() * p.element_size()),
                                          loc(device), ctypes.c_uint(0), s)
            if err != 0:
                raise RuntimeError(f"cudaMemPrefetchAsync failed: cudaError {err}")
        side.synchronize()

    def batch_variants(nbytes, count):
        def pieces_on_cpu():
            return list(managed_on_cpu(nbytes).chunk(count))

        def pieces_on_gpu():
            m = torch_uvm.manage_memory(torch.empty(nbytes // 2, dtype=torch.float16,
                                                    device=dev))
            m.fill_(1)
            sync()
            return list(m.chunk(count))
        return {
            "prefetch_to_gpu_one_call_each": (lambda ps: prefetch_each(ps, dev), pieces_on_cpu),
            "prefetch_to_gpu_batch": (lambda ps: batch_call("cudaMemPrefetchBatchAsync", ps, dev),
                                      pieces_on_cpu),
            "migrate_to_cpu_one_call_each": (lambda ps: prefetch_each(ps, cpu), pieces_on_gpu),
            "migrate_to_cpu_batch": (lambda ps: batch_call("cudaMemPrefetchBatchAsync", ps, cpu),
                                     pieces_on_gpu),
            # for dead data only (freed gradients, activations): contents lost
            "discard_batch": (lambda ps: batch_call("cudaMemDiscardBatchAsync", ps),
                              pieces_on_gpu),
            "discard_and_prefetch_to_cpu_batch": (
                lambda ps: batch_call("cudaMemDiscardAndPrefetchBatchAsync", ps, cpu),
                pieces_on_gpu),
        }

    # --- copies between a managed CPU tensor and the GPU ----------------------
    def copy_h2d_variants(nbytes):
        n = nbytes // 4
        dst = torch.empty(n, device=dev)
        dst16 = torch.empty(n, dtype=torch.float16, device=dev)
        pinned = torch.ones(n).pin_memory()

        def src():
            return managed_on_cpu(nbytes, torch.float32)
        layers = 8
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, n // layers // 1024, bias=False)
                                      for _ in range(layers)]).to(dev)

        def state():
            return {k: torch_uvm.manage_memory(torch.ones_like(v, device="cpu"))
                    for k, v in model.state_dict().items()}
        pinned_state = {k: torch.ones_like(v, device="cpu").pin_memory()
                        for k, v in model.state_dict().items()}
        return {
            "pinned_copy": (lambda: dst.copy_(pinned), None),
            "copy_stock": (stock(lambda m: dst.copy_(m)), src),
            "copy_prefetch": (lambda m: dst.copy_(m), src),
            "to_fp16_pinned": (lambda: pinned.to(dev, torch.float16), None),
            "to_fp16_stock": (stock(lambda m: m.to(dev, torch.float16)), src),
            "to_fp16_prefetch": (lambda m: m.to(dev, torch.float16), src),
            "copy_fp16_prefetch": (lambda m: dst16.copy_(m), src),
            "load_state_dict_pinned": (lambda: model.load_state_dict(pinned_state), None),
            "load_state_dict_stock": (stock(lambda sd: model.load_state_dict(sd)), state),
            "load_state_dict_prefetch": (lambda sd: model.load_state_dict(sd), state),
        }

    def copy_h2d_advice_variants(nbytes):
        """Which of UVM-on's differences slows a prefetching copy: the CPU
        segment's advice (preferred location CPU, accessed by the GPU) on the
        source, or a managed destination."""
        n = nbytes // 4
        plain_dst = torch.empty(n, device=dev)
        managed_dst = torch_uvm.manage_memory(torch.empty(n, device=dev))

        def src(advised):
            def prepare():
                m = managed_on_cpu(nbytes, torch.float32)
                if advised:
                    _C.advise(m, "preferred_location", cpu)
                    _C.advise(m, "accessed_by", dev)
                sync()
                return m
            return prepare
        return {
            "copy_plain_dst": (lambda m: plain_dst.copy_(m), src(False)),
            "copy_plain_dst_advised_src": (lambda m: plain_dst.copy_(m), src(True)),
            "copy_managed_dst": (lambda m: managed_dst.copy_(m), src(False)),
            "copy_managed_dst_advised_src": (lambda m: managed_dst.copy_(m), src(True)),
            "prefetch_only_advised_src": (lambda m: _C.prefetch(m, dev, None), src(True)),
            # residency by timing: HBM speed if the prefetch migrated
            "read_after_prefetch_advised_src": (
                lambda m: _C.alias_on_device(m, dev).sum(),
                lambda: _prefetched(src(True))),
            "read_after_prefetch_unadvised_src": (
                lambda m: _C.alias_on_device(m, dev).sum(),
                lambda: _prefetched(src(False))),
            "prefetch_then_d2d_advised_src": (
                lambda m: (_C.prefetch(m, dev, None),
                           managed_dst.copy_(_C.alias_on_device(m, dev))), src(True)),
            # no migration: a GPU kernel reads the host pages in place, over
            # PCIe, through the mapping that accessed_by makes
            "kernel_reads_in_place_advised_src": (
                lambda m: torch.mul(_C.alias_on_device(m, dev), 1.0, out=plain_dst), src(True)),
            "advise_then_kernel_reads_in_place": (
                lambda m: (_C.advise(m, "preferred_location", cpu),
                           _C.advise(m, "accessed_by", dev),
                           torch.mul(_C.alias_on_device(m, dev), 1.0, out=plain_dst)),
                src(False)),
        }

    def copy_d2h_variants(nbytes):
        n = nbytes // 4
        pinned = torch.empty(n).pin_memory()
        managed_dst = torch_uvm.manage_memory(torch.zeros(n))
        pageable_dst = torch.zeros(n)
        staging = [torch.empty(min(n, 16 * MiB // 4)).pin_memory() for _ in range(2)]
        copy_stream = torch.cuda.Stream(dev)

        def on_gpu():
            m = torch.ones(n, device=dev)
            sync()
            return m

        def staged(dst, m, chunk=16 * MiB // 4):
            # a pinned copy of each piece, then a CPU copy into dst, pipelined
            events = []
            for i, start in enumerate(range(0, n, chunk)):
                buf = staging[i % 2]
                if i >= 2:
                    events[i - 2][1].synchronize()   # buffer free again
                k = min(chunk, n - start)
                with torch.cuda.stream(copy_stream):
                    buf[:k].copy_(m[start:start + k], non_blocking=True)
                    e = torch.cuda.Event()
                    e.record()
                events.append((start, e, k))
                if i >= 1:
                    s0, e0, k0 = events[i - 1]
                    e0.synchronize()
                    dst[s0:s0 + k0].copy_(staging[(i - 1) % 2][:k0])
            s0, e0, k0 = events[-1]
            e0.synchronize()
            dst[s0:s0 + k0].copy_(staging[(len(events) - 1) % 2][:k0])
            return dst
        return {
            "to_pinned": (lambda m: pinned.copy_(m), on_gpu),
            "to_managed_cpu_stock": (stock(lambda m: managed_dst.copy_(m)), on_gpu),
            "to_managed_cpu_fast_copy": (lambda m: managed_dst.copy_(m), on_gpu),
            "to_pageable_stock": (lambda m: pageable_dst.copy_(m), on_gpu),
            "to_managed_cpu_staged_pinned": (lambda m: staged(managed_dst, m), on_gpu),
            "to_pageable_staged_pinned": (lambda m: staged(pageable_dst, m), on_gpu),
        }

    # --- a streamed tensor's home (host pages) and its GPU slot (issue 20) ----
    # Copy engines between managed pages that stay on the CPU (preferred
    # location CPU; accessed-by maps them for the GPU) and a GPU buffer,
    # against pinned memory; both directions at once; an optimizer step whose
    # states are read and written in place over PCIe.
    def home(nbytes, accessed_by=True):
        m = managed_on_cpu(nbytes, torch.float32)
        _C.advise(m, "preferred_location", cpu)
        if accessed_by:
            _C.advise(m, "accessed_by", dev)
        sync()
        return _C.alias_on_device(m, dev)

    def pinned_on_gpu(nbytes):
        """A CUDA tensor over pinned host memory (mapped: kernels read and
        write it in place over PCIe), through CuPy; None without CuPy."""
        try:
            import cupy
        except ImportError:
            return None
        host = torch.ones(nbytes // 4).pin_memory()
        mem = cupy.cuda.UnownedMemory(host.data_ptr(), host.nbytes, host, device_id=dev.index or 0)
        arr = cupy.ndarray((nbytes // 4,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
        return torch.from_dlpack(arr)

    def pieces(dst, src, k, streams):
        cur = torch.cuda.current_stream(dev)
        for st in streams:
            st.wait_stream(cur)
        for i, (d, s_) in enumerate(zip(dst.chunk(k), src.chunk(k))):
            with torch.cuda.stream(streams[i % len(streams)]):
                d.copy_(s_, non_blocking=True)
        for st in streams:
            cur.wait_stream(st)

    def slot_variants(nbytes, to_gpu):
        # to_gpu: a home copied into GPU memory; else GPU memory written home
        n = nbytes // 4
        slot = torch.empty(n, device=dev) if to_gpu else torch.ones(n, device=dev)
        pinned = torch.ones(n).pin_memory() if to_gpu else torch.empty(n).pin_memory()
        mapped, unmapped = home(nbytes), home(nbytes, accessed_by=False)

        def copy(home_side):
            dst, src = (slot, home_side) if to_gpu else (home_side, slot)
            return stock(lambda: dst.copy_(src))
        names = ("copy_from_home", "read_home") if to_gpu else ("write_home", "write_home")
        dst, src = (slot, mapped) if to_gpu else (mapped, slot)
        return {
            "pinned_copy": ((lambda: slot.copy_(pinned, non_blocking=True)) if to_gpu else
                            (lambda: pinned.copy_(slot, non_blocking=True)), None),
            f"{names[0]}_accessed_by": (copy(mapped), None),
            f"{names[0]}_pref_cpu_only": (copy(unmapped), None),
            f"{names[0]}_8_pieces_2_streams": (
                stock(lambda: pieces(dst, src, 8, side_streams[:2])), None),
            f"{names[1]}_in_place_elementwise": (lambda: torch.add(src, 0, out=dst), None),
        }

    def slot_both_variants(nbytes):
        # nbytes each way, at once on two streams: GB/s counts both
        n = nbytes // 4
        up, down = torch.empty(n, device=dev), torch.ones(n, device=dev)
        p_in, p_out = torch.ones(n).pin_memory(), torch.empty(n).pin_memory()
        h_in, h_out = home(nbytes), home(nbytes)

        def both(dst1, src1, dst2, src2):
            cur = torch.cuda.current_stream(dev)
            a, b = side_streams[:2]
            a.wait_stream(cur)
            b.wait_stream(cur)
            with torch.cuda.stream(a):
                dst1.copy_(src1, non_blocking=True)
            with torch.cuda.stream(b):
                dst2.copy_(src2, non_blocking=True)
            cur.wait_stream(a)
            cur.wait_stream(b)
        def kernel_copy(dst, src):     # a bitwise op on int64 words: every bit kept
            torch.bitwise_or(src.view(torch.int64), 0, out=dst.view(torch.int64))

        def mixed(h2d_kernel, d2h_kernel):
            cur = torch.cuda.current_stream(dev)
            a, b = side_streams[:2]
            a.wait_stream(cur)
            b.wait_stream(cur)
            with torch.cuda.stream(a):
                kernel_copy(up, h_in) if h2d_kernel else up.copy_(h_in)
            with torch.cuda.stream(b):
                kernel_copy(h_out, down) if d2h_kernel else h_out.copy_(down)
            cur.wait_stream(a)
            cur.wait_stream(b)
        g_in, g_out = pinned_on_gpu(nbytes), pinned_on_gpu(nbytes)
        extra = {} if g_in is None else {
            "pinned_kernel_both_ways": (lambda: mixed_on(g_in, g_out), None),
            "pinned_copy_engine_in_kernel_out": (lambda: mixed_on(g_in, g_out, h2d_kernel=False),
                                                 None)}

        def mixed_on(src_home, dst_home, h2d_kernel=True):
            cur = torch.cuda.current_stream(dev)
            a, b = side_streams[:2]
            a.wait_stream(cur)
            b.wait_stream(cur)
            with torch.cuda.stream(a):
                kernel_copy(up, src_home) if h2d_kernel else up.copy_(p_in, non_blocking=True)
            with torch.cuda.stream(b):
                kernel_copy(dst_home, down)
            cur.wait_stream(a)
            cur.wait_stream(b)
        return {
            **extra,
            "pinned_both_ways": (lambda: both(up, p_in, p_out, down), None),
            "home_both_ways": (stock(lambda: both(up, h_in, h_out, down)), None),
            "home_copy_engine_in_kernel_out": (stock(lambda: mixed(False, True)), None),
            "home_kernel_in_copy_engine_out": (stock(lambda: mixed(True, False)), None),
            "home_kernel_both_ways": (stock(lambda: mixed(True, True)), None),
        }

    def adamw_variants(nbytes):
        # one fused AdamW step over nbytes of fp32 weights (grads, two moments)
        n = nbytes // 4
        p, g = torch.ones(n, device=dev), torch.full((n,), 1e-3, device=dev)
        m_dev, v_dev = torch.zeros(n, device=dev), torch.zeros(n, device=dev)
        m_home, v_home = home(nbytes), home(nbytes)
        m_slot, v_slot = torch.zeros(n, device=dev), torch.zeros(n, device=dev)
        step = torch.zeros((), device=dev)

        def adamw(m, v):
            torch._fused_adamw_([p], [g], [m], [v], [], [step], lr=1e-4, beta1=0.9,
                                beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False,
                                maximize=False)

        def copied():
            m_slot.copy_(m_home)
            v_slot.copy_(v_home)
            adamw(m_slot, v_slot)
            m_home.copy_(m_slot)
            v_home.copy_(v_slot)
        m_pin, v_pin = pinned_on_gpu(nbytes), pinned_on_gpu(nbytes)
        m_cpu, v_cpu = torch.zeros(n).pin_memory(), torch.zeros(n).pin_memory()
        if m_pin is not None:
            m_pin.zero_(), v_pin.zero_()

        def copied_pinned():
            m_slot.copy_(m_cpu, non_blocking=True)
            v_slot.copy_(v_cpu, non_blocking=True)
            adamw(m_slot, v_slot)
            m_cpu.copy_(m_slot, non_blocking=True)
            v_cpu.copy_(v_slot, non_blocking=True)
        extra = {} if m_pin is None else {
            "states_pinned_in_place_over_pcie": (lambda: adamw(m_pin, v_pin), None)}
        return {
            **extra,
            "states_pinned_copied_in_and_out": (copied_pinned, None),
            "states_on_gpu": (lambda: adamw(m_dev, v_dev), None),
            "states_in_place_over_pcie": (lambda: adamw(m_home, v_home), None),
            "states_copied_in_and_out": (stock(copied), None),
        }

    def contention_variants(nbytes):
        # 32 fp32 GEMMs (a backward's: 256 x 4096 by 4096 x 4096) on the
        # current stream, alone or while a side stream moves `nbytes` of
        # AdamW states: in place by the fused kernel (it holds SMs while it
        # waits on PCIe) or by copy engines (they hold none)
        n = nbytes // 4
        x, w = torch.randn(256, 4096, device=dev), torch.randn(4096, 4096, device=dev)
        p, g = torch.ones(n, device=dev), torch.full((n,), 1e-3, device=dev)
        m_home, v_home = home(nbytes), home(nbytes)
        step = torch.zeros((), device=dev)
        slot = torch.empty(n, device=dev)
        p_in, p_out = torch.ones(n).pin_memory(), torch.empty(n).pin_memory()
        back = torch.ones(n, device=dev)

        def gemms():
            for _ in range(32):
                torch.mm(x, w)

        def beside(work):
            def run():
                cur = torch.cuda.current_stream(dev)
                a = side_streams[0]
                a.wait_stream(cur)
                with torch.cuda.stream(a):
                    work()
                gemms()
                cur.wait_stream(a)
            return run

        def adamw_in_place():
            torch._fused_adamw_([p], [g], [m_home], [v_home], [], [step], lr=1e-4, beta1=0.9,
                                beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False,
                                maximize=False)

        def copies_both_ways():
            b = side_streams[1]
            b.wait_stream(torch.cuda.current_stream(dev))
            slot.copy_(p_in, non_blocking=True)
            with torch.cuda.stream(b):
                p_out.copy_(back, non_blocking=True)
            torch.cuda.current_stream(dev).wait_stream(b)
        return {
            "gemms_alone": (gemms, None),
            "adamw_in_place_alone": (adamw_in_place, None),
            "gemms_beside_adamw_in_place": (beside(adamw_in_place), None),
            "pinned_copies_alone": (copies_both_ways, None),
            "gemms_beside_pinned_copies": (beside(copies_both_ways), None),
        }

    # each group's variants are made only if the group runs (--only)
    plan = []
    for nbytes in (128 * MiB, 1 * GiB):
        plan.append((f"to_gpu {nbytes // MiB} MiB", nbytes, to_gpu_variants, (nbytes,)))
    for batch in (16, 128, 1024):
        plan.append((f"gemm batch {batch}", 8192 * 8192 * 2, gemm_variants, (batch,)))
    plan.append(("cycle 128 MiB", 128 * MiB, cycle_variants, (128 * MiB,)))
    plan.append(("evict 128 MiB", 128 * MiB, evict_variants, (128 * MiB,)))
    for nbytes in (64 * MiB, 1 * GiB):
        plan.append((f"to_cpu {nbytes // MiB} MiB", nbytes, to_cpu_variants, (nbytes,)))
    plan.append(("batch 128 MiB in 64 ranges", 128 * MiB, batch_variants, (128 * MiB, 64)))
    for nbytes in (64 * MiB, 1 * GiB):
        plan.append((f"copy_h2d {nbytes // MiB} MiB", nbytes, copy_h2d_variants, (nbytes,)))
    plan.append(("copy_h2d_advice 256 MiB", 256 * MiB, copy_h2d_advice_variants, (256 * MiB,)))
    for nbytes in (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 1 * GiB):
        plan.append((f"copy_d2h {nbytes // MiB} MiB", nbytes, copy_d2h_variants, (nbytes,)))
    for nbytes in (128 * MiB, 1 * GiB):
        plan.append((f"slot_h2d {nbytes // MiB} MiB", nbytes, slot_variants, (nbytes, True)))
        plan.append((f"slot_d2h {nbytes // MiB} MiB", nbytes, slot_variants, (nbytes, False)))
    plan.append(("slot_both 1024 MiB each way", 2 * GiB, slot_both_variants, (1 * GiB,)))
    plan.append(("adamw 256 MiB of weights", 256 * MiB, adamw_variants, (256 * MiB,)))
    plan.append(("contention 256 MiB", 256 * MiB, contention_variants, (256 * MiB,)))
    if args.only:
        plan = [p for p in plan if any(p[0].startswith(o) for o in args.only.split(","))]
    groups = {name: (nbytes, make(*a)) for name, nbytes, make, a in plan}
    results = {g: {v: [] for v in variants} for g, (_, variants) in groups.items()}
    for g, (_, variants) in groups.items():           # one warm-up of each
        for fn, prep in variants.values():
            timed(fn, prep)
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        for g, (_, variants) in groups.items():
            for v, (fn, prep) in variants.items():
                results[g][v].append(timed(fn, prep))

    table = ["| case | variant | ms (median, min-max) | GB/s |", "|---|---|---|---|"]
    summary = {}
    for g, (nbytes, variants) in groups.items():
        summary[g] = {}
        for v in variants:
            s = method.summarize([t * 1e3 for t in results[g][v]])
            s["gbps"] = nbytes / (s["median"] / 1e3) / 1e9
            summary[g][v] = s
            table.append(f"| {g} | {v} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) "
                         f"| {s['gbps']:.1f} |")
    print("\n".join(table))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "mechanisms")
    with open(stem + ".json", "w") as f:
        json.dump({"machine": method.machine(), "rounds": args.rounds, "ms": summary}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(table) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = [(f"{g}: {v}", s["gbps"]) for g, d in summary.items() for v, s in d.items()]
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1))
        ax.barh([r[0] for r in rows][::-1], [r[1] for r in rows][::-1])
        ax.set_xscale("log")
        ax.set_xlabel("GB/s (bytes of the range / wall time)")
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
