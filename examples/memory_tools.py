"""PyTorch's memory tools with UVM on (docs/memory.md): torch.cuda's memory
API, a memory snapshot for the visualizer, and the cap that keeps managed
memory from overfilling the GPU.

    python examples/memory_tools.py

Needs a CUDA GPU; without one it says so and exits with status 2.
"""
import os
import pickle
import sys
import tempfile

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402

MiB = 1 << 20


def the_memory_api():
    before = torch.cuda.memory_allocated()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() == before + 3 * MiB     # PyTorch's API counts it
    assert torch.cuda.memory_stats()["allocated_bytes.all.current"] == before + 3 * MiB
    c = torch.empty(5 * MiB, dtype=torch.uint8)                  # managed, its home the CPU
    assert torch.cuda.memory_allocated() == before + 3 * MiB     # not a GPU's ...
    assert torch_uvm.memory_stats()["allocated_bytes.all.current"] >= 8 * MiB   # ... but ours
    print(f"torch.cuda.memory_allocated(): {torch.cuda.memory_allocated() / MiB:.1f} MiB; "
          f"with CPU-homed tensors: "
          f"{torch_uvm.memory_stats()['allocated_bytes.all.current'] / MiB:.1f} MiB")
    del x, c


def a_snapshot(folder):
    # Python stacks only: symbolizing C++ frames takes minutes.
    torch.cuda.memory._record_memory_history(max_entries=10000, stacks="python")
    try:
        kept = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
        path = os.path.join(folder, "snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)                   # open at pytorch.org/memory_viz
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    actions = {e["action"] for e in snapshot["device_traces"][0]}
    assert "alloc" in actions and snapshot["segments"]
    print(f"snapshot: {len(snapshot['segments'])} segments, events {sorted(actions)}")
    del kept


def the_cap():
    torch_uvm.empty_cache()
    old_cap = torch_uvm.get_memory_cap()
    print(f"the cap on managed memory: {old_cap / 2**30:.1f} GiB")
    # A small cap for this demonstration: 256 MiB above what is reserved now.
    torch_uvm.set_memory_cap(torch_uvm.memory_stats()["reserved_bytes.all.current"] + 256 * MiB)
    try:
        keep = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
            raise AssertionError("an allocation past the cap succeeded")
        except torch.OutOfMemoryError as e:
            print(f"past the cap: torch.OutOfMemoryError ({str(e).splitlines()[0][:100]}...)")
        del keep                                                  # free, and go on
        again = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        del again
        print("after freeing a tensor, the same allocation fits")
    finally:
        torch_uvm.empty_cache()
        torch_uvm.set_memory_cap(old_cap)


def main():
    torch_uvm.set_enabled_uvm(True)
    the_memory_api()
    with tempfile.TemporaryDirectory() as folder:
        a_snapshot(folder)
    the_cap()


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU: managed memory lives on one", file=sys.stderr)
        sys.exit(2)
    main()
