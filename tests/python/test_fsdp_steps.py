"""torch_uvm.fsdp.step_in_backward on two CPU ranks (gloo), as FSDP2 users
write it: each param group steps as its reduced gradients complete, and the
losses, parameters and optimizer states equal FSDP2's own step after
backward, bit for bit. Accumulation FSDP2's way (its gradient sync off but
for the last micro-batch) steps as FSDP2 does; clipping, accumulation with
the sync on, and a closure are refused."""
import os
import socket
import threading
import traceback

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import torch_uvm.fsdp as tfsdp  # noqa: E402

STEPS = 3


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make(mesh, **options):
    """Three Linear blocks (9 rows: shards of uneven size), each fully_shard
    (with `options`: mp_policy, say), and the root."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 9), torch.nn.ReLU(), torch.nn.Linear(9, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 4))
    for block in (model[0], model[2], model[4]):
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def train(model, optimizer, rank, out, steps=None):
    torch.manual_seed(10 + rank)
    losses = []
    for _ in range(STEPS):
        loss = model(torch.randn(4, 8)).square().mean()
        loss.backward()
        if steps is not None:    # (CPU shards: their steps run on the worker)
            steps.wait()
        out.setdefault("grads_after_backward", []).append(
            sum(p.grad is not None for p in model.parameters()))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def full(model, optimizer):
    """Every parameter and AdamW state, whole (the ranks' shards gathered)."""
    params = [p.full_tensor() for p in model.parameters()]
    states = [optimizer.state[p][k].full_tensor() for p in model.parameters()
              for k in ("exp_avg", "exp_avg_sq")]
    return params, states


def worker(rank, world, port, queue):
    out = {}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        torch.set_num_threads(1)     # (two ranks and a host step's worker on a small CI machine)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        reference = make(mesh)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.05)
        want = train(reference, ref_opt, rank, {})
        model = make(mesh)
        stray = torch.optim.SGD([*model.parameters(), torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        try:
            tfsdp.step_in_backward(model, stray)
        except ValueError as err:
            out["other"] = str(err)
        out["other_untouched"] = "step" not in vars(stray)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
        steps = tfsdp.step_in_backward(model, optimizer)
        steps.on_local_shards = True
        out["groups"] = steps.names
        seen = optimizer.register_step_pre_hook(lambda o, _a, _k: out.setdefault(
            "worker_saw", []).append((threading.current_thread() is threading.main_thread(),
                                      sorted({type(p).__name__ for g in o.param_groups
                                              for p in g["params"]}))))
        got = train(model, optimizer, rank, out, steps)
        seen.remove()
        # the states keyed by the parameters alone (no local shard left), so a
        # checkpoint's state_dict reads them
        out["state_keys_are_params"] = (
            {id(k) for k in optimizer.state} == {id(p) for p in model.parameters()}
            and len(optimizer.state_dict()["state"]) == len(list(model.parameters())))
        out["losses_equal"] = got == want
        (gp, gs), (wp, ws) = full(model, optimizer), full(reference, ref_opt)
        out["params_equal"] = all(torch.equal(a, b) for a, b in zip(gp, wp))
        out["states_equal"] = all(torch.equal(a, b) for a, b in zip(gs, ws))
        # clipping what stepped in backward, a second backward before the
        # step, and a closure: each refused
        model(torch.randn(4, 8)).sum().backward()
        steps.wait()       # (what clipping would see is then the same on both ranks)
        try:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        except RuntimeError as err:
            out["clip"] = str(err)
        try:
            model(torch.randn(4, 8)).sum().backward()
        except RuntimeError as err:
            out["accumulate"] = str(err)
        with torch.no_grad():
            out["evaluates"] = model(torch.randn(4, 8)).shape == (4, 4)
        try:
            optimizer.step(lambda: 0.0)
        except ValueError as err:
            out["closure"] = str(err)
        optimizer.step()
        optimizer.zero_grad()
        try:
            tfsdp.step_in_backward(model, optimizer)
        except ValueError as err:
            out["twice"] = str(err)
        steps.undo()
        model(torch.randn(4, 8)).sum().backward()           # FSDP2's own again
        out["grads_after_undo"] = sum(p.grad is not None for p in model.parameters())
        before = [p.full_tensor() for p in model.parameters()]
        optimizer.step()
        out["undo_steps"] = any(not torch.equal(a, p.full_tensor())
                                for a, p in zip(before, model.parameters()))
        # an optimizer without one of a group's parameters: its gradient stays
        partial = make(mesh)
        popt = torch.optim.AdamW([p for n, p in partial.named_parameters() if n != "2.weight"],
                                 lr=0.05)
        psteps = tfsdp.step_in_backward(partial, popt)
        partial(torch.randn(4, 8)).sum().backward()
        psteps.wait()
        out["kept_other_grad"] = partial[2].weight.grad is not None and \
            partial[2].bias.grad is None
        popt.step()
        psteps.undo()

        def thawed(ours):
            """A part frozen at the install, thawed after it (before FSDP2's
            lazy init at the first forward, which fixes what it gathers
            with gradients)."""
            m = make(mesh)
            m[4].weight.requires_grad_(False)
            o = torch.optim.AdamW(m.parameters(), lr=0.05)
            if ours:
                tfsdp.step_in_backward(m, o)
            m[4].weight.requires_grad_(True)
            torch.manual_seed(20 + rank)
            for _ in range(2):
                m(torch.randn(4, 8)).square().mean().backward()
                o.step()
                o.zero_grad()
            return [p.full_tensor() for p in m.parameters()]
        out["thaw_equal"] = all(torch.equal(a, b) for a, b in zip(thawed(True), thawed(False)))

        def accumulated(ours):
            """Two micro-batches a step, FSDP2's way: its gradient sync off
            for the first (nothing reduced, so nothing steps), on for the
            last (each group steps as its reduced gradients complete)."""
            m = make(mesh)
            o = torch.optim.AdamW(m.parameters(), lr=0.05)
            if ours:
                s = tfsdp.step_in_backward(m, o)
            torch.manual_seed(30 + rank)
            stepped = []
            for _ in range(2):
                m.set_requires_gradient_sync(False)
                m(torch.randn(4, 8)).square().mean().backward()
                if ours:
                    stepped.append(s.lifecycle.stepped_in_backward())
                m.set_requires_gradient_sync(True)
                m(torch.randn(4, 8)).square().mean().backward()
                if ours:
                    stepped.append(sorted(s.lifecycle.stepped_in_backward()))
                o.step()
                o.zero_grad()
            return [p.full_tensor() for p in m.parameters()], stepped
        def frozen(ours):
            """A block frozen throughout and another frozen in part (its
            weight): the rest steps, in backward, as FSDP2 steps it."""
            m = make(mesh)
            m[2].requires_grad_(False)
            m[4].weight.requires_grad_(False)
            o = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=0.05)
            if ours:
                s = tfsdp.step_in_backward(m, o)     # (on_local_shards on: the default)
                o.register_step_pre_hook(lambda o, _a, _k: out.setdefault(
                    "default_saw", set()).update(type(p).__name__ for g in o.param_groups
                                                 for p in g["params"]))
            torch.manual_seed(40 + rank)
            stepped = []
            for _ in range(2):
                m(torch.randn(4, 8)).square().mean().backward()
                if ours:
                    stepped.append(sorted(s.names[u] for u in s.lifecycle.stepped_in_backward()))
                o.step()
                o.zero_grad()
            return [p.full_tensor() for p in m.parameters()], stepped
        (ours, stepped), (theirs, _) = frozen(True), frozen(False)
        out["frozen_equal"] = all(torch.equal(a, b) for a, b in zip(ours, theirs))
        out["frozen_stepped"] = stepped
        (ours, stepped), (theirs, _) = accumulated(True), accumulated(False)
        out["accumulated_equal"] = all(torch.equal(a, b) for a, b in zip(ours, theirs))
        out["accumulated_first_stepped"] = stepped
        dist.destroy_process_group()
    except BaseException:
        out["error"] = traceback.format_exc()
    queue.put((rank, out))


def spawn_ranks(target, *args, world: int = 2) -> dict:
    """target(rank, world, port, *args, queue) on `world` spawned ranks:
    {rank: what it put}, none with an error."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for r, out in results.items():
        assert "error" not in out, f"rank {r}:\n{out['error']}"
    return results


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(worker)


def test_each_param_group_steps_in_backward_as_fsdp2_steps_after_it(ranks):
    for out in ranks.values():
        assert out["groups"] == ["4", "2", "0"]        # one a block; the root owns none
        assert out["grads_after_backward"] == [0] * STEPS   # stepped, their gradients let go
        assert out["losses_equal"] and out["params_equal"] and out["states_equal"]


def test_the_worker_steps_each_groups_local_shards_once_they_have_states(ranks):
    """DTensor's dispatch keeps the GIL through a kernel: a worker stepping
    DTensors stalls the backward's Python hooks (narrowed_step.py). With
    on_local_shards, each group's first step makes its states as DTensors;
    the later ones step the local shards, bit for bit as FSDP2's own step
    (the test above)."""
    for out in ranks.values():
        assert out["worker_saw"] == [(False, ["DTensor"])] * 3 + [(False, ["Tensor"])] * 6
        assert out["state_keys_are_params"]
        # on by default: the first step makes the states, the local shards step after
        assert out["default_saw"] == {"DTensor", "Tensor"}


def test_what_the_optimizer_does_not_hold_and_a_part_thawed_later_step_as_fsdp2_steps(ranks):
    for out in ranks.values():
        assert out["kept_other_grad"]      # not the optimizer's: its gradient stays
        assert out["thaw_equal"]           # waited for once it requires grad


def test_accumulation_with_fsdp2s_gradient_sync_off_steps_as_fsdp2_steps(ranks):
    for out in ranks.values():
        # nothing reduced, nothing stepped; then every group, in the last backward
        assert out["accumulated_first_stepped"] == [[], [0, 1, 2], [], [0, 1, 2]]
        assert out["accumulated_equal"]


def test_frozen_blocks_and_parts_leave_the_rest_stepping_as_fsdp2_steps(ranks):
    for out in ranks.values():
        assert out["frozen_equal"]
        assert out["frozen_stepped"] == [["0", "4"]] * 2    # in backward; "2" is frozen whole


def test_clipping_accumulation_and_a_closure_are_refused(ranks):
    for out in ranks.values():
        assert "stepped in this backward" in out["clip"] and "fsdp.step_in_backward" in \
            out["clip"]
        assert "a forward with gradients before optimizer.step()" in out["accumulate"]
        assert out["evaluates"]
        assert "step(closure)" in out["closure"]
        assert "steps in backward already" in out["twice"]
        assert "1 parameters that are not the sharded model's" in out["other"]
        assert out["other_untouched"]
        assert out["grads_after_undo"] == 6 and out["undo_steps"]


def test_a_model_without_fully_shard_and_lbfgs_are_refused():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="call fully_shard on its blocks"):
        tfsdp.step_in_backward(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="LBFGS cannot step a group at a time"):
        tfsdp.step_in_backward(model, torch.optim.LBFGS(model.parameters()))
