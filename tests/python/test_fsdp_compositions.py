"""torch_uvm.fsdp.step_in_backward on two CPU ranks (gloo), as FSDP2 users
write a resumed run and mixed precision, and its steps on the host's worker:

- a run saved with torch.distributed.checkpoint after two steps, loaded
  into a fresh model and optimizer, and resumed, equals the run that did
  not stop, bit for bit (losses, parameters, AdamW's states);
- with FSDP2's MixedPrecisionPolicy (bf16 parameters gathered, fp32
  reduced), the steps in backward equal FSDP2's own step after backward;
- the shards are on the CPU, so each group steps on the worker: the
  backward returns while a step is held back, and the next forward waits
  for it (the results equal FSDP2's own step after backward)."""
import threading
import time
import os
import traceback

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

import torch_uvm.fsdp as tfsdp  # noqa: E402
from test_fsdp_steps import full, make, spawn_ranks  # noqa: E402

STEPS, SAVED_AT = 4, 2


def batches(rank):
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(4, 8, generator=g) for _ in range(STEPS)]


def steps(model, optimizer, xs):
    losses = []
    for x in xs:
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def resumed(mesh, rank, folder, out):
    """The uninterrupted run against one saved at SAVED_AT and resumed in a
    fresh model and optimizer, each stepping in backward."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    xs = batches(rank)
    whole = make(mesh)
    whole_opt = torch.optim.AdamW(whole.parameters(), lr=0.05)
    tfsdp.step_in_backward(whole, whole_opt)
    want = steps(whole, whole_opt, xs)

    first = make(mesh)
    first_opt = torch.optim.AdamW(first.parameters(), lr=0.05)
    tfsdp.step_in_backward(first, first_opt)
    got = steps(first, first_opt, xs[:SAVED_AT])
    model_sd, optim_sd = get_state_dict(first, first_opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)

    again = make(mesh)
    again_opt = torch.optim.AdamW(again.parameters(), lr=0.05)
    tfsdp.step_in_backward(again, again_opt)
    model_sd, optim_sd = get_state_dict(again, again_opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(again, again_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    got += steps(again, again_opt, xs[SAVED_AT:])
    out["resumed_losses_equal"] = got == want
    (gp, gs), (wp, ws) = full(again, again_opt), full(whole, whole_opt)
    out["resumed_params_equal"] = all(torch.equal(a, b) for a, b in zip(gp, wp))
    out["resumed_states_equal"] = all(torch.equal(a, b) for a, b in zip(gs, ws))
    out["resumed_step_count"] = float(again_opt.state[next(again.parameters())]["step"])


def mixed(mesh, rank, out):
    """FSDP2's MixedPrecisionPolicy: bf16 gathered, fp32 reduced."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    xs = batches(rank)
    runs = []
    for ours in (False, True):
        model = make(mesh, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
        if ours:
            tfsdp.step_in_backward(model, optimizer)
        runs.append((steps(model, optimizer, xs), full(model, optimizer)))
    (want, (wp, ws)), (got, (gp, gs)) = runs
    out["mixed_losses_equal"] = got == want
    out["mixed_params_equal"] = all(torch.equal(a, b) for a, b in zip(gp, wp))
    out["mixed_states_equal"] = all(torch.equal(a, b) for a, b in zip(gs, ws))
    out["mixed_params_fp32"] = all(p.dtype == torch.float32 for p in gp)


class HeldAdamW(torch.optim.AdamW):
    """AdamW whose step waits until `gate` is set (on the host's worker),
    and says in `order` when each step is done."""

    def __init__(self, params, gate, order, **kw):
        super().__init__(params, **kw)
        self.gate, self.order = gate, order

    def step(self, closure=None):
        assert self.gate.wait(timeout=60), "the step was never let go"
        self.threads = torch.get_num_threads()
        result = super().step(closure)
        self.order.append("step")
        return result


def held(mesh, rank, out):
    """Steps on the worker overlap the backward; a forward and
    optimizer.step() wait for them. (The gate opens 0.5 s later on a timer:
    with the waits, the order is the same however late it opens.)"""
    xs = batches(rank)
    reference = make(mesh)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.05)
    want = steps(reference, ref_opt, xs)
    gate, order = threading.Event(), []
    model = make(mesh)
    optimizer = HeldAdamW(model.parameters(), gate, order, lr=0.05)
    os.environ["TORCH_UVM_HOST_STEP_THREADS"] = "3"   # (the rank's own are 1: worker())
    try:
        shard_steps = tfsdp.step_in_backward(model, optimizer)
    finally:
        del os.environ["TORCH_UVM_HOST_STEP_THREADS"]
    model.register_forward_pre_hook(lambda _m, _a: order.append("forward"))  # (after the waits)
    got = []
    for i, x in enumerate(xs):
        gate.clear()
        loss = model(x).square().mean()
        loss.backward()                       # returns with the groups' steps held back
        out.setdefault("held_pending_after_backward", []).append(shard_steps.pending())
        out.setdefault("held_grads_after_backward", []).append(
            sum(p.grad is not None for p in model.parameters()))
        del order[:]
        threading.Timer(0.5, gate.set).start()
        if i == 0:                            # an evaluation's forward waits for them
            with torch.no_grad():
                model(x)
        if i == 1:                            # so does a state_dict (a checkpoint's)
            saved = optimizer.state_dict()
            out["held_pending_after_state_dict"] = shard_steps.pending()
            out["held_state_dict_params"] = len(saved["state"])
        optimizer.step()                      # and so does the step
        out.setdefault("held_order", []).append(list(order))
        out.setdefault("held_pending_after_step", []).append(shard_steps.pending())
        optimizer.zero_grad()
        got.append(loss.item())
    out["held_losses_equal"] = got == want
    later = []                  # a thread begun after the steps takes the rank's count
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    out["held_threads"] = (shard_steps.threads, optimizer.threads, torch.get_num_threads(),
                           later[0])
    out["held_stats"] = shard_steps.stats()
    (gp, gs), (wp, ws) = full(model, optimizer), full(reference, ref_opt)
    out["held_params_equal"] = all(torch.equal(a, b) for a, b in zip(gp, wp))
    out["held_states_equal"] = all(torch.equal(a, b) for a, b in zip(gs, ws))


class FailingAdamW(torch.optim.AdamW):
    """Its first step fails; the others take a while, then step."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.calls = 0

    def step(self, closure=None):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("this step failed")
        time.sleep(0.2)
        return super().step(closure)


def failing(mesh, rank, out):
    """A step that fails on the worker raises at optimizer.step(), once
    every queued step ended; the step is then over, the failed group keeps
    its gradients, and another optimizer.step() steps it."""
    model = make(mesh)
    optimizer = FailingAdamW(model.parameters(), lr=0.05)
    shard_steps = tfsdp.step_in_backward(model, optimizer)
    model(batches(rank)[0]).square().mean().backward()      # the backward itself goes on
    try:
        optimizer.step()
    except RuntimeError as err:
        out["failed_step"] = str(err)
    out["failed_pending"] = shard_steps.pending()
    kept = [p for p in model.parameters() if p.grad is not None]
    out["failed_kept_grads"] = len(kept)
    before = [p.to_local().clone() for p in kept]
    optimizer.step()                                      # the failed group, again
    out["failed_retried"] = all(not torch.equal(a, p.to_local()) for a, p in zip(before, kept))
    optimizer.zero_grad()
    model(batches(rank)[1]).square().mean().backward()    # a new step may begin
    optimizer.step()
    out["failed_then_trains"] = True
    try:
        tfsdp.step_in_backward(make(mesh), torch.optim.LBFGS(make(mesh).parameters()))
    except ValueError as err:
        out["lbfgs"] = str(err)

    class Talking(torch.optim.Optimizer):    # (a step of its own, which may communicate)
        def step(self, closure=None):
            pass
    other = make(mesh)
    talking = Talking(other.parameters(), {})
    try:
        tfsdp.step_in_backward(other, talking)
    except ValueError as err:
        out["talking"] = str(err)
    out["talking_untouched"] = "step" not in vars(talking)


def worker(rank, world, port, folder, queue):
    out = {}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)     # (two ranks and a host step's worker on a small CI machine)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        resumed(mesh, rank, folder, out)
        mixed(mesh, rank, out)
        held(mesh, rank, out)
        failing(mesh, rank, out)
        dist.destroy_process_group()
    except BaseException:
        out["error"] = traceback.format_exc()
    queue.put((rank, out))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks(worker, str(tmp_path_factory.mktemp("dcp")))


def test_a_run_saved_with_dcp_and_resumed_equals_the_run_that_did_not_stop(ranks):
    for out in ranks.values():
        assert out["resumed_losses_equal"]
        assert out["resumed_params_equal"] and out["resumed_states_equal"]
        assert out["resumed_step_count"] == STEPS


def test_mixed_precision_steps_in_backward_as_fsdp2_steps_after_it(ranks):
    for out in ranks.values():
        assert out["mixed_losses_equal"]
        assert out["mixed_params_equal"] and out["mixed_states_equal"]
        assert out["mixed_params_fp32"]       # the sharded parameters stay fp32


def test_the_host_steps_overlap_the_backward_and_the_forward_and_step_wait_for_them(ranks):
    for out in ranks.values():
        assert out["held_pending_after_backward"] == [3] * STEPS   # every group's, held back
        assert out["held_grads_after_backward"] == [6] * STEPS     # let go after its step
        assert out["held_order"] == [["step"] * 3 + ["forward"]] + [["step"] * 3] * (STEPS - 1)
        assert out["held_pending_after_step"] == [0] * STEPS
        assert out["held_pending_after_state_dict"] == 0 and out["held_state_dict_params"] == 6
        assert out["held_threads"] == (3, 3, 1, 1)   # the worker's, chosen; the rank's, kept
        stats = out["held_stats"]                  # every group's steps, each waited for
        assert stats["host_steps"] == 3 * STEPS
        assert stats["host_seconds"] > 0 and stats["waited_seconds"] > 0
        assert out["held_losses_equal"]
        assert out["held_params_equal"] and out["held_states_equal"]


def test_a_host_step_that_fails_raises_at_the_step_after_the_others_end(ranks):
    for out in ranks.values():
        assert out["failed_step"] == "this step failed"
        assert out["failed_pending"] == 0            # the others ended before it raised
        assert out["failed_kept_grads"] == 2         # the failed group's weight and bias
        assert out["failed_retried"] and out["failed_then_trains"]
        assert "whose step may communicate" not in out["lbfgs"]   # (LBFGS: its own refusal)
        assert "this one is a Talking, whose step may communicate" in out["talking"]
        assert out["talking_untouched"]
