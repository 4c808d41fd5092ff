"""CUDA graphs, make_graphed_callables, MemPool and
torch.compile(mode="reduce-overhead") with UVM on (docs/cuda-graphs.md).

    python examples/cuda_graphs.py

Needs a CUDA GPU (and Triton, for torch.compile); without a GPU it says so
and exits with status 2.
"""
import os
import sys

import torch

# From a checkout, without installing torch_uvm: the repository's copy.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_uvm  # noqa: E402

MiB = 1 << 20


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 256)).cuda()


def a_graph_with_temporaries():
    model = mlp()
    static_in = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()                           # warm up on a side stream, as PyTorch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = model(static_in)                    # temporaries: the graph's private pool
    for _ in range(3):
        new = torch.randn(64, 256, device="cuda")
        static_in.copy_(new)
        graph.replay()
        with torch.no_grad():
            torch.testing.assert_close(static_out, model(new), rtol=1e-4, atol=1e-4)
    print("a captured forward replays with new inputs")


def graphed_callables():
    model = mlp()
    sample = torch.randn(16, 256, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))   # forward and backward
    x = torch.randn(16, 256, device="cuda", requires_grad=True)
    graphed(x).sum().backward()
    assert x.grad is not None
    print("make_graphed_callables: forward and backward replay")


def a_mempool():
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(MiB, dtype=torch.uint8, device="cuda")   # from the pool's segments
    in_pool = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pool.id]
    assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in in_pool)
    print("torch.cuda.MemPool: the tensor came from the pool")
    del t


def compiled_with_cuda_graphs():
    model = mlp()
    compiled = torch.compile(model, mode="reduce-overhead")   # CUDA graph trees
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(64, 256, device="cuda")
            out = compiled(x).clone()                        # a graph's output: clone to keep it
            torch.testing.assert_close(out, model(x), rtol=2e-3, atol=2e-3)
    print('torch.compile(mode="reduce-overhead") gives the eager output')


def main():
    torch_uvm.set_enabled_uvm(True)
    a_graph_with_temporaries()
    graphed_callables()
    a_mempool()
    compiled_with_cuda_graphs()


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    main()
