"""narrowed_step.step_over: an optimizer's own step over some of its
parameters; with on_local_shards, DTensors (FSDP2's shards) stepped through
plain tensors sharing their storage, bit for bit as stepping the DTensors.
Run on a one-rank gloo mesh in a fresh interpreter (a process group of its
own)."""
import json

import pytest

from conftest import run_python

pytest.importorskip("torch.distributed.tensor")

CODE = r"""
import json, os, socket
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch_uvm.narrowed_step import step_over

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))


class Halving(torch.optim.Optimizer):
    # elementwise, and its step replaces its states (new tensors), not in place
    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                if not st:
                    st["count"], st["buf"] = torch.zeros(()), torch.zeros_like(p)
                st["count"] = st["count"] + 1
                st["buf"] = st["buf"] * 0.5 + p.grad
                p.sub_(0.1 * st["buf"])


def run(make, local):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(distribute_tensor(torch.randn(9, 4), mesh, [Shard(0)]))
          for _ in range(3)]
    opt = make(ps)
    seen = []
    opt.register_step_pre_hook(lambda o, _a, _k: seen.append(
        sorted({type(p).__name__ for g in o.param_groups for p in g["params"]})))
    for _ in range(3):
        for p in ps:
            p.grad = distribute_tensor(torch.randn(9, 4), mesh, [Shard(0)])
        step_over(opt, opt.step, {id(ps[0]), id(ps[2])}, {}, local)

    def whole(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t
    return ([whole(p) for p in ps],
            [{k: whole(v) for k, v in opt.state[p].items()} for p in ps], seen,
            sorted((k, type(v).__name__) for k, v in opt.state[ps[0]].items()))


out = {}
for name, make in {
        "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
        "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
        "halving": Halving}.items():
    (wp, ws, _, _), (gp, gs, seen, kinds) = run(make, False), run(make, True)
    out[name] = {
        "params_equal": all(torch.equal(a, b) for a, b in zip(wp, gp)),
        "states_equal": all(w.keys() == g.keys() and all(torch.equal(w[k], g[k]) for k in w)
                            for w, g in zip(ws, gs)),
        "untouched_has_no_state": gs[1] == {},
        "seen": seen, "kinds": kinds}
# a step that raises: the groups and the states as they were, keyed by the parameters
make = lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True)
torch.manual_seed(0)
ps = [torch.nn.Parameter(distribute_tensor(torch.randn(9, 4), mesh, [Shard(0)]))
      for _ in range(3)]
opt = make(ps)
for p in ps:
    p.grad = distribute_tensor(torch.randn(9, 4), mesh, [Shard(0)])
opt.step()


def fails():
    opt.step()
    raise RuntimeError("this step failed")


try:
    step_over(opt, fails, {id(ps[0]), id(ps[2])}, {}, True)
except RuntimeError as e:
    out["raised"] = str(e)
out["after_raise"] = {
    "groups": [len(g["params"]) for g in opt.param_groups],
    "keys_are_params": {id(k) for k in opt.state} == {id(p) for p in ps},
    "state_dict": len(opt.state_dict()["state"]),
    "states_dtensors": all(type(v).__name__ == "DTensor" for p in ps
                           for k, v in opt.state[p].items() if k != "step")}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def results():
    r = run_python(CODE, timeout=240)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, r.stdout + r.stderr
    return json.loads(line[0][len("RESULT "):])


@pytest.mark.parametrize("optimizer", ["adamw_fused", "adamw_foreach", "sgd_momentum"])
def test_dtensors_stepped_on_their_local_shards_equal_stepping_the_dtensors(results, optimizer):
    got = results[optimizer]
    assert got["params_equal"] and got["states_equal"] and got["untouched_has_no_state"]
    # the first step makes the states from the DTensors; the later ones step local shards
    assert got["seen"] == [["DTensor"], ["Tensor"], ["Tensor"]]


def test_a_state_the_step_replaces_reaches_the_dtensors(results):
    got = results["halving"]
    assert got["params_equal"] and got["states_equal"]
    assert got["seen"] == [["DTensor"], ["Tensor"], ["Tensor"]]
    # a replaced DTensor state is written into its shard; a replaced plain one is kept
    assert got["kinds"] == [["buf", "DTensor"], ["count", "Tensor"]]


def test_a_step_that_raises_leaves_the_groups_and_the_states_keyed_by_the_parameters(results):
    assert results["raised"] == "this step failed"
    assert results["after_raise"] == {"groups": [3], "keys_are_params": True, "state_dict": 3,
                                      "states_dtensors": True}
