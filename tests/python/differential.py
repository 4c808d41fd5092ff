"""The random differential test: offloaded training against all resident,
bit for bit, on models and loops drawn from a seed.

`program(seed)` draws a model and a training loop and writes them as a short
Python program: a model class (Linear, Conv2d, BatchNorm, LayerNorm,
Embedding, dropout, a module that writes buffers in forward, tied and shared
weights, frozen parts, blocks streamed as one unit), a `loop` of the lines a
user writes (train()/eval() toggles, no_grad passes, accumulation, clipping,
a checkpoint and its resume), and SETTINGS (mode, ahead, the step in or
after backward, the optimizer, and the budget: the least the model trains in,
and a fraction of the whole model beside it). `check(source)` runs that program
twice, all resident and offloaded, and compares outputs, losses, weights,
buffers and optimizer states bit for bit, before and after undo(); after
every line of the loop the weights on the GPU (asked of the driver, apart
from the books) stay within the budget. A failing seed raises with the
program, which reproduces it on its own (`python repro.py` beside this
file). scripts/differential.py runs hundreds of seeds; test_differential.py
checks the programs on the CPU, test_gpu_differential.py runs a few on the
GPU."""
from __future__ import annotations

import random
import textwrap
from typing import Callable, Dict, List, Optional

import torch

FEATURES = ("embedding", "conv", "batchnorm", "layernorm", "dropout", "writes_buffers",
            "tied", "shared", "frozen", "blocks")
ACTIONS = ("train", "eval", "recalibrate", "accumulate", "clip", "checkpoint", "resume")

# Kept in every program: what all of them need.
PRELUDE = '''\
import io
import torch
from torch import nn


class WritesBuffers(nn.Module):
    """Writes two buffers in forward: one through .data (its version
    unmoved), not saved; one counted in place, saved."""
    def __init__(self):
        super().__init__()
        self.register_buffer("last", torch.zeros(()), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.last.data.copy_(x.detach().float().mean())
        self.calls += 1
        return x


class Block(nn.Module):
    """Two Linears and a norm, streamed as one unit where units=Block."""
    def __init__(self, width):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.b = nn.Linear(width, width)

    def forward(self, x):
        return x + self.b(torch.relu(self.norm(self.a(x))))
'''


def program(seed: int) -> str:
    """The program seed `seed` draws (the same text for the same seed)."""
    r = random.Random(seed)
    width = r.choice([16, 32, 64])
    classes = 10
    on = {f: r.random() < 0.45 for f in FEATURES}
    if on["embedding"]:
        on["conv"] = False
    init: List[str] = []
    body: List[str] = []
    linears: List[str] = []
    if on["embedding"]:
        vocab = r.choice([24, 40])
        classes = vocab
        init.append(f"self.emb = nn.Embedding({vocab}, {width})")
        body.append("h = self.emb(x)")
        inputs = f"torch.randint(0, {vocab}, (rows,), device=device, generator=g)"
    elif on["conv"]:
        channels = r.choice([4, 8])
        init.append(f"self.conv = nn.Conv2d(3, {channels}, 3, padding=1)")
        body.append("h = self.conv(x)")
        if on["batchnorm"]:
            init.append(f"self.bn2d = nn.BatchNorm2d({channels})")
            body.append("h = torch.relu(self.bn2d(h))")
        init.append(f"self.proj = nn.Linear({channels * 16}, {width})")
        body.append("h = self.proj(h.flatten(1))")
        inputs = "torch.randn(rows, 3, 4, 4, device=device, generator=g)"
    else:
        init.append(f"self.inp = nn.Linear({width}, {width})")
        body.append("h = self.inp(x)")
        linears.append("inp")
        inputs = f"torch.randn(rows, {width}, device=device, generator=g)"
    # enough units that the least budget (a window and a step's room, about
    # five of the largest) is below the whole model: most budgets stream
    layers = ["linear"] * r.randint(4, 10)
    layers += [f for f in ("batchnorm", "layernorm", "dropout", "writes_buffers", "blocks")
               if on[f]]
    r.shuffle(layers)
    for k, kind in enumerate(layers):
        name = f"l{k}"
        if kind == "linear":
            init.append(f"self.{name} = nn.Linear({width}, {width})")
            body.append(f"h = torch.relu(self.{name}(h))")
            linears.append(name)
            continue
        made = {"batchnorm": f"nn.BatchNorm1d({width})", "layernorm": f"nn.LayerNorm({width})",
                "writes_buffers": "WritesBuffers()", "blocks": f"Block({width})"}.get(kind)
        if made is None:                    # dropout, its rate drawn here
            made = f"nn.Dropout({r.choice([0.1, 0.5])})"
        init.append(f"self.{name} = {made}")
        body.append(f"h = self.{name}(h)")
    if on["shared"] and linears:            # one module in two places, run twice
        again = r.choice(linears)
        init.append(f"self.again = self.{again}")
        body.append("h = torch.tanh(self.again(h))")
    if on["tied"] and on["embedding"]:
        init.append(f"self.head = nn.Linear({width}, {classes}, bias=False)")
        init.append("self.head.weight = self.emb.weight")
    else:
        on["tied"] = False
        init.append(f"self.head = nn.Linear({width}, {classes})")
    body.append("return self.head(h)")
    if on["frozen"] and linears:
        frozen = r.choice(linears)
        init.append(f"self.{frozen}.requires_grad_(False)")
    else:
        on["frozen"] = False

    in_backward = r.random() < 0.5
    count = r.randint(3, 7)
    actions: List[str] = []
    saved = False
    for _ in range(count):
        choices = ["train", "train", "eval", "recalibrate"]
        if not in_backward:
            choices += ["accumulate", "clip"]
        choices += ["resume"] if saved else ["checkpoint"]
        a = r.choice(choices)
        saved = saved or a == "checkpoint"
        actions.append(a)
    actions.append("train")
    settings = dict(
        mode=r.choice(["auto", "in_place", "prefetch"]),
        ahead=r.choice([1, 1, 2]),
        step_in_backward=in_backward,
        optimizer=r.choice(["AdamW", "Adam", "SGD"]),
        units="Block" if on["blocks"] and r.random() < 0.5 else None,
        budget_fraction=r.choice([0.0, 0.0, 1.0, round(r.random(), 3)]),
    )
    loop = _loop(actions, r.choice([2, 4, 8]), inputs, classes)
    used = sorted(f for f in FEATURES if on[f]) + sorted(set(actions))
    return "\n".join([
        f"# torch_uvm differential program, seed {seed}: {', '.join(used)}",
        PRELUDE,
        "",
        "class Net(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        *[f"        {line}" for line in init],
        "",
        "    def forward(self, x):",
        *[f"        {line}" for line in body],
        "",
        "",
        "def build():",
        f"    torch.manual_seed({seed})",
        "    return Net()",
        "",
        "",
        f"SETTINGS = {settings!r}",
        "",
        "",
        loop,
        "",
        "if __name__ == '__main__':",
        "    from differential import check",
        "    check(open(__file__).read())",
        "    print('equal to all resident')",
        "",
    ])


def _loop(actions: List[str], rows: int, inputs: str, classes: int) -> str:
    lines = [
        "def loop(model, optimizer, probe, device='cuda'):",
        '    """The same lines all resident and offloaded; probe() after each."""',
        "    seen = []",
        "    def batch(i, rows=%d):" % rows,
        "        g = torch.Generator(device=device).manual_seed(1000 + i)",
        f"        x = {inputs}",
        f"        return x, torch.randint(0, {classes}, (rows,), device=device, generator=g)",
        "    def loss_of(i):",
        "        x, y = batch(i)",
        "        return nn.functional.cross_entropy(model(x), y)",
    ]
    for i, a in enumerate(actions):
        lines.append(f"    # {a}")
        if a in ("train", "clip"):
            lines += ["    model.train()", f"    loss = loss_of({i})", "    loss.backward()"]
            if a == "clip":
                lines.append("    seen.append(torch.nn.utils.clip_grad_norm_("
                             "model.parameters(), 0.5))")
            lines += ["    optimizer.step()", "    optimizer.zero_grad()",
                      "    seen.append(loss.detach())"]
        elif a == "accumulate":
            lines += ["    model.train()", f"    (loss_of({i}) / 2).backward()",
                      f"    (loss_of({i + 100}) / 2).backward()", "    optimizer.step()",
                      "    optimizer.zero_grad()"]
        elif a == "eval":
            lines += ["    model.eval()", "    with torch.no_grad():",
                      f"        seen.append(model(batch({i})[0]))", "    model.train()"]
        elif a == "recalibrate":
            lines += ["    model.train()", "    with torch.no_grad():",
                      f"        seen.append(model(batch({i})[0]))"]
        elif a == "checkpoint":
            lines += ["    saved = io.BytesIO()",
                      "    torch.save({'model': model.state_dict(), "
                      "'optimizer': optimizer.state_dict()}, saved)"]
        elif a == "resume":
            lines += ["    saved.seek(0)", "    state = torch.load(saved, weights_only=False)",
                      "    model.load_state_dict(state['model'])",
                      "    optimizer.load_state_dict(state['optimizer'])"]
        lines.append("    probe()")
    lines.append("    return seen")
    return "\n".join(lines)


def load(source: str) -> dict:
    """The program's names (build, loop, SETTINGS)."""
    names: Dict[str, object] = {"__name__": "differential_program"}
    exec(compile(source, "<differential program>", "exec"), names)
    return names


def make_optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if kind == "SGD":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return getattr(torch.optim, kind)(model.parameters(), lr=1e-2)


def everything(model: torch.nn.Module,
               optimizer: Optional[torch.optim.Optimizer] = None) -> Dict[str, torch.Tensor]:
    """Weights, buffers (saved or not) and, given the optimizer, its states,
    by name, on the CPU."""
    def copy(t):
        return t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) else t
    seen = {f"param {n}": copy(p) for n, p in model.named_parameters()}
    seen.update({f"buffer {n}": copy(b) for n, b in model.named_buffers()})
    for n, p in model.named_parameters() if optimizer is not None else []:
        for k, v in optimizer.state.get(p, {}).items():
            seen[f"state {n}.{k}"] = copy(v)
    return seen


def differences(got, want, where: str) -> List[str]:
    if isinstance(want, dict):
        if got.keys() != want.keys():
            return [f"{where}: names {sorted(set(got) ^ set(want))[:6]}"]
        return [d for k in want for d in differences(got[k], want[k], f"{where} {k}")]
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return [f"{where}: {len(got)} values, all resident {len(want)}"]
        return [d for k, (a, b) in enumerate(zip(got, want)) for d in differences(a, b, f"{where}[{k}]")]
    if isinstance(want, torch.Tensor):
        same = isinstance(got, torch.Tensor) and got.shape == want.shape and \
            torch.equal(got.cpu(), want.cpu())
        return [] if same else [f"{where}"]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def run_resident(names: dict, device: str = "cuda"):
    """The program all resident on `device`: (what the loop gave, everything)."""
    settings = names["SETTINGS"]
    model = names["build"]().to(device)
    optimizer = make_optimizer(settings["optimizer"], model)
    torch.manual_seed(7)
    got = names["loop"](model, optimizer, lambda: None, device=device)
    return got, everything(model, optimizer)


def least_and_whole(names: dict) -> tuple:
    """The least budget the program's model trains in with its settings, and
    its whole size (weights and buffers), from an offload undone at once."""
    import torch_uvm
    settings = names["SETTINGS"]
    model = names["build"]()
    whole = sum(t.nbytes for t in {id(t): t for t in
                                   list(model.parameters()) + list(model.buffers())}.values())
    units = names.get(settings["units"]) if settings["units"] else None
    handle = torch_uvm.offload(model, budget=max(whole, 1 << 20), mode=settings["mode"],
                               ahead=settings["ahead"], units=units)
    least = handle.least_budget(training=True)
    handle.undo()
    return least, whole


def check(source: str, on_budget: Optional[Callable[[int, int, int], None]] = None) -> dict:
    """Runs the program all resident and offloaded; raises AssertionError
    with the program's text if anything differs or the budget is passed.
    Returns what it measured (budget, the most weights' bytes seen on the GPU)."""
    import torch_uvm
    from conftest import where
    names = load(source)
    settings = names["SETTINGS"]
    was = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    handle = None
    try:
        want, want_all = run_resident(names)
        least, whole = least_and_whole(names)
        # 0: the least (every unit streams); 1: room for the whole model
        # beside the least, which streaming needs (every unit resident)
        budget = least + int(settings["budget_fraction"] * whole)
        model = names["build"]()
        units = names.get(settings["units"]) if settings["units"] else None
        handle = torch_uvm.offload(model, budget=budget, mode=settings["mode"],
                                   ahead=settings["ahead"], units=units)
        optimizer = handle.stream_optimizer(make_optimizer(settings["optimizer"], model),
                                            step_in_backward=settings["step_in_backward"])
        most = [0]

        def probe():
            torch.cuda.synchronize()
            seen = {t.data_ptr(): t.nbytes for t in list(model.parameters()) +
                    list(model.buffers()) if t.numel() and where(t) == "gpu"}
            most[0] = max(most[0], sum(seen.values()))
        torch.manual_seed(7)
        got = names["loop"](model, optimizer, probe)
        torch.cuda.synchronize()
        wrong = differences(got, want, "loop's values") + \
            differences(everything(model, optimizer), want_all, "before undo():")
        peak = handle.residency_stats()["resident_bytes.peak"]
        streamed = len(handle.units) - len(handle.resident_units())
        handle.undo()
        # (the optimizer's states follow the parameters put back)
        wrong += differences(everything(model, optimizer), want_all, "after undo():")
        if most[0] > budget:
            wrong.append(f"the driver saw {most[0]} bytes of weights on the GPU, budget {budget}")
        if peak > budget:
            wrong.append(f"the books' peak {peak} bytes passed the budget {budget}")
        if wrong:
            raise AssertionError(_report(source, wrong))
        return {"budget": budget, "least": least, "whole": whole, "on_gpu": most[0],
                "peak": peak, "streamed": streamed, "units": len(handle.units)}
    except AssertionError:
        raise
    except Exception as e:     # an error offloaded that all resident did not raise
        raise AssertionError(_report(source, [f"{type(e).__name__}: {e}"])) from e
    finally:
        torch.backends.cudnn.deterministic = was
        if handle is not None:
            handle.undo()


def _report(source: str, wrong: List[str]) -> str:
    return ("offloaded differs from all resident:\n  " + "\n  ".join(wrong[:12]) +
            (f"\n  ... and {len(wrong) - 12} more" if len(wrong) > 12 else "") +
            "\n\nThis program reproduces it (save it as repro.py in tests/python; "
            "python repro.py):\n\n" + textwrap.indent(source, ""))
