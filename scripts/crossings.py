"""How often an offload's training step crosses from Python to the C++
executor, and how many Python callbacks it runs, per unit per step: the
measure issue 54 asks of the lifecycle, before and after its redesign.
Counted without a GPU: the offload's Python half runs on a CPU model over
the fake executor of tests/python/lifecycle.py, which takes the calls the
C++ executor takes (the counts do not depend on the GPU or the sizes).

    python3 scripts/crossings.py [--layers 28] [--out FILE.json]

The model has a Llama decoder layer's units (four attention projections,
three MLP projections, two norms) times --layers, an embedding, a final
norm and a head: 28 layers give the 255 units of the 3B the benchmarks
train. It trains three steps with AdamW (the step after backward, and
step_in_backward); the last step is counted."""
import argparse
import collections
import json
import os
import platform
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from method import machine  # noqa: E402

from lifecycle import cpu_streams, offload_on_cpu  # noqa: E402

# The Python functions an offload's hooks and callbacks enter first: each
# call is one callback from PyTorch (a module hook, a tensor hook, a
# gradient hook, autograd's end-of-backward callback).
CALLBACKS = {"_pre", "_post", "_begin", "_end_forward", "_cast_cache_off", "_cast_cache_back",
             "hook", "_grads_done", "_end_backward"}


class Layer(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width, bias=False)
                                          for _ in range(4))
        self.gate, self.up = (torch.nn.Linear(width, 2 * width, bias=False) for _ in range(2))
        self.down = torch.nn.Linear(2 * width, width, bias=False)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.o(self.q(h) * torch.sigmoid(self.k(h)) + self.v(h))
        h = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def model(layers, width=8):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, width),
                               *(Layer(width) for _ in range(layers)),
                               torch.nn.LayerNorm(width), torch.nn.Linear(width, 16, bias=False))


class Counting:
    """The executor, each call counted by name."""

    def __init__(self, inner):
        self.inner, self.calls = inner, collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)
        return counted


def count(layers, in_backward):
    net = model(layers)
    with cpu_streams():
        handle, executor = offload_on_cpu(net)
        counting = Counting(executor)
        handle.state.executor = counting
        # (the gradient hooks count into the lifecycle in C++: no crossing)
        life = Counting(handle.state.lifecycle)
        handle.state.lifecycle = life
        optimizer = handle.stream_optimizer(torch.optim.AdamW(net.parameters(), lr=1e-3),
                                            step_in_backward=in_backward)
        callbacks = collections.Counter()

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_name in CALLBACKS and \
                    "torch_uvm" in frame.f_code.co_filename:
                callbacks[frame.f_code.co_name] += 1
        tokens = torch.randint(0, 16, (2, 4))
        for step in range(3):
            if step == 2:
                counting.calls.clear()
                life.calls.clear()
                sys.setprofile(profile)
            net(tokens).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        sys.setprofile(None)
    units = len(handle.units)
    crossings = sum(counting.calls.values()) + sum(life.calls.values())
    return {"units": units, "executor_calls": dict(counting.calls),
            "executor_calls_per_unit": round(sum(counting.calls.values()) / units, 2),
            "lifecycle_calls": dict(life.calls),
            "crossings_per_unit": round(crossings / units, 2),
            "callbacks": dict(callbacks),
            "callbacks_per_unit": round(sum(callbacks.values()) / units, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    where = machine() | {"cpu": platform.processor() or platform.machine()}
    for key in ("gpu", "driver"):      # (counted without one: said so, not left empty)
        where[key] = where[key] or "none: counted on the CPU"
    result = {"machine": where,
              "step_after_backward": count(args.layers, False),
              "step_in_backward": count(args.layers, True)}
    for mode in ("step_after_backward", "step_in_backward"):
        r = result[mode]
        print(f"{mode}: {r['units']} units; executor calls {sum(r['executor_calls'].values())} "
              f"({r['executor_calls_per_unit']} a unit): {r['executor_calls']}; lifecycle calls "
              f"{r['lifecycle_calls']}; crossings {r['crossings_per_unit']} a unit; Python callbacks "
              f"{sum(r['callbacks'].values())} ({r['callbacks_per_unit']} a unit): "
              f"{r['callbacks']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
