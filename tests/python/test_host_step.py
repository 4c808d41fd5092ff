"""host_step.py without a GPU: which submodules step on the host, the
values it refuses, and its arithmetic: PyTorch's fused CPU Adam/AdamW, as
the optimizer's own fused step on the CPU gives it."""
import types

import pytest
import torch

from torch_uvm import host_step


def fake_handle(sizes, resident=(), share=0.5):
    """An offload's view as choose() reads it: units in the forward's order,
    some resident."""
    units = [types.SimpleNamespace(index=i, name=str(i), trainable=[object()] if n else [],
                                   trainable_bytes=n) for i, n in enumerate(sizes)]
    executor = types.SimpleNamespace(resident=lambda i: i in resident)
    return types.SimpleNamespace(host_step=share, learned=True, executor=executor,
                                 units_in_order=lambda: list(units))


@pytest.mark.parametrize("share, names", [(0.0, []), (0.5, ["5", "4"]), (1.0, ["5", "4", "3", "2"]),
                                          (0.2, ["5"]), (0.1, [])])
def test_the_last_streamed_units_step_on_the_host(share, names):
    # units 0 and 1 resident; 6 is frozen; four streamed of 10 bytes
    handle = fake_handle([10, 10, 10, 10, 10, 10, 0], resident={0, 1}, share=share)
    assert [u.name for u in host_step.choose(handle)] == names


def test_a_unit_is_taken_when_half_of_it_falls_within_the_share():
    handle = fake_handle([40, 10, 10], share=0.2)           # 12 of 60 bytes: 10 and 5 of 10
    assert [u.name for u in host_step.choose(handle)] == ["2"]
    handle = fake_handle([10, 10, 40], share=0.25)          # the last is 40: 20 > 15
    assert host_step.choose(handle) == []


def test_nothing_steps_on_the_host_before_a_plan():
    handle = fake_handle([10, 10], share=1.0)
    handle.learned = False
    assert host_step.choose(handle) == []


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan"), True, "half", None])
def test_a_share_outside_0_to_1_is_refused(share):
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])
    with pytest.raises(ValueError, match=r"from 0 \(none, the default\) to 1"):
        host_step.check(optimizer, share)


def test_other_optimizers_are_refused_for_a_host_step_not_for_none():
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="this optimizer is a SGD"):
        host_step.check(torch.optim.SGD([p], lr=0.1), 0.5)
    with pytest.raises(ValueError, match="differentiable"):
        host_step.check(torch.optim.Adam([p], differentiable=True), 0.5)
    assert host_step.check(torch.optim.SGD([p], lr=0.1), 0) == 0.0
    assert host_step.check(torch.optim.Adam([p]), 1) == 1.0


@pytest.mark.parametrize("kind", [torch.optim.AdamW, torch.optim.Adam])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_host_steps_arithmetic_is_the_fused_cpu_optimizers(kind, amsgrad):
    """_adam_on_cpu over the state lists equals the optimizer's own fused
    step on the CPU, bit for bit, for three steps (weight decay decoupled
    for AdamW, added to the gradient for Adam)."""
    torch.manual_seed(0)
    ours = torch.randn(1000)
    theirs = torch.nn.Parameter(ours.clone())
    optimizer = kind([theirs], lr=1e-2, weight_decay=0.1, amsgrad=amsgrad, fused=True)
    group = optimizer.param_groups[0]
    moments = [torch.zeros(1000) for _ in range(3 if amsgrad else 2)]
    step = torch.zeros(())
    for _ in range(3):
        grad = torch.randn(1000)
        theirs.grad = grad.clone()
        optimizer.step()
        host_step._adam_on_cpu(kind is torch.optim.AdamW, host_step._hyperparameters(group),
                               [ours], [grad], [moments[0]],
                               [moments[1]], moments[2:], [step])
        assert torch.equal(ours, theirs.detach())
    assert torch.equal(moments[0], optimizer.state[theirs]["exp_avg"])
    assert step.item() == 3


def test_the_host_steps_threads_leave_two_cores_or_follow_the_variable(monkeypatch):
    monkeypatch.delenv(host_step.THREADS_VARIABLE, raising=False)
    assert host_step.threads() == max(1, torch.get_num_threads() - 2)
    monkeypatch.setenv(host_step.THREADS_VARIABLE, "3")
    assert host_step.threads() == 3
    p = torch.nn.Parameter(torch.zeros(4))
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv(host_step.THREADS_VARIABLE, bad)
        with pytest.raises(ValueError, match="TORCH_UVM_HOST_STEP_THREADS is the number"):
            host_step.check(torch.optim.AdamW([p]), 0.5)
    assert host_step.check(torch.optim.AdamW([p]), 0) == 0.0     # no host step: not read


def test_a_ranks_host_step_takes_its_share_of_the_cores_but_two_or_follows_the_variable(
        monkeypatch):
    monkeypatch.delenv(host_step.THREADS_VARIABLE, raising=False)
    bound = set(range(32))
    monkeypatch.setattr(host_step.os, "cpu_count", lambda: 32)
    monkeypatch.setattr(host_step.os, "sched_getaffinity", lambda _pid: bound)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")            # (torchrun's, for each rank)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert host_step.rank_threads() == 14
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert host_step.rank_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert host_step.rank_threads() == 1                   # (at least one)
    bound = set(range(8))                                  # a rank bound to 8 cores: those
    assert host_step.rank_threads() == 6
    bound = set(range(32))
    for bad in ("two", "0", "-1"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE is the number of ranks"):
            host_step.rank_threads()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert host_step.rank_threads() == 30                  # (no process group: one rank)
    import torch.distributed as dist                       # (else the process group's ranks)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    assert host_step.rank_threads() == 6
    monkeypatch.setenv(host_step.THREADS_VARIABLE, "3")
    assert host_step.rank_threads() == 3
    monkeypatch.setenv(host_step.THREADS_VARIABLE, "many")
    with pytest.raises(ValueError, match="TORCH_UVM_HOST_STEP_THREADS is the number"):
        host_step.rank_threads()


def test_the_gradients_copying_home_take_an_eighth_of_the_budget_or_the_variables_share(
        monkeypatch):
    monkeypatch.delenv(host_step.COPIES_VARIABLE, raising=False)
    assert host_step.copies_share() == host_step.COPIES_AHEAD_SHARE == 1 / 8
    monkeypatch.setenv(host_step.COPIES_VARIABLE, "0.01")
    assert host_step.copies_share() == 0.01
    p = torch.nn.Parameter(torch.zeros(4))
    for bad in ("-0.5", "2", "nan", "an eighth"):
        monkeypatch.setenv(host_step.COPIES_VARIABLE, bad)
        with pytest.raises(ValueError, match="TORCH_UVM_HOST_STEP_COPIES is the share of the budget"):
            host_step.check(torch.optim.AdamW([p]), 0.5)
    assert host_step.check(torch.optim.AdamW([p]), 0) == 0.0     # no host step: not read


def test_under_gpu_memory_the_copies_home_stay_within_the_gradients_the_plan_counted():
    """The copies home may take copies_share of the budget, unless an
    offload's gpu_memory set a cap: its plan's room for them (they sit
    beside the slots: an eighth of an 8 GiB budget is 1 GiB the bound's
    plan would not hold)."""
    steps = host_step.HostSteps(torch.device("cpu"))
    assert steps.copies_limit(8 << 30) == 1 << 30          # an eighth
    steps.copies_share = 0.25
    assert steps.copies_limit(8 << 30) == 2 << 30
    steps.copies_cap = 300 << 20
    assert steps.copies_limit(8 << 30) == 300 << 20
    assert steps.copies_limit(1 << 30) == 256 << 20        # (the share's, where less)


@pytest.mark.parametrize("overflow", [False, True])
def test_the_host_step_reads_a_grad_scalers_scale_as_a_fused_adam_does(overflow):
    """GradScaler hands a fused Adam its scale and overflow flag rather than
    unscaling: the host's step divides by the scale, and skips the step
    (weights and count unchanged) on an overflow, as the optimizer's own."""
    torch.manual_seed(0)
    ours = torch.randn(1000)
    theirs = torch.nn.Parameter(ours.clone())
    optimizer = torch.optim.AdamW([theirs], lr=1e-2, fused=True)
    scale, found = torch.tensor(1024.0), torch.tensor(1.0 if overflow else 0.0)
    optimizer.grad_scale, optimizer.found_inf = scale, found
    grad = torch.randn(1000) * 1024
    theirs.grad = grad.clone()
    optimizer.step()
    moments, step = [torch.zeros(1000), torch.zeros(1000)], torch.zeros(())
    before = ours.clone()
    host_step._adam_on_cpu(True, host_step._hyperparameters(optimizer.param_groups[0]),
                           [ours], [grad], [moments[0]],
                           [moments[1]], [], [step], grad_scale=scale, found_inf=found)
    assert torch.equal(ours, theirs.detach())
    assert torch.equal(ours, before) == overflow and step.item() == (0 if overflow else 1)


def test_an_adam_subclass_with_a_step_of_its_own_is_refused():
    class Mine(torch.optim.AdamW):
        def step(self, closure=None):
            return super().step(closure)

    class Plain(torch.optim.AdamW):
        pass
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="this optimizer is a Mine"):
        host_step.check(Mine([p]), 1.0)
    assert host_step.check(Plain([p]), 1.0) == 1.0


def test_a_step_whose_wait_for_the_gpu_fails_fails_itself_not_the_worker():
    """A CUDA error met while the worker chooses or waits (an illegal access
    in the backward) is that step's error, raised where it is waited for,
    naming it: the worker never dies with steps left that no one finishes."""
    class Broken:
        def query(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        synchronize = query
    steps = host_step.HostSteps(torch.device("cuda", 0))
    steps._threads = steps._caller_threads = torch.get_num_threads()
    item = host_step._Queued(3, "layers.3", 3, [Broken()], [])
    steps._waiting.append(item)
    steps._pending.append(item)
    steps._run_next()
    assert item.future.done() and not steps._waiting
    with pytest.raises(RuntimeError, match="host step of submodule 'layers.3' failed "
                                           r"\(CUDA error: an illegal memory access"):
        steps.wait()
    assert not steps.pending


def test_the_host_worker_gives_the_callers_thread_count_back_after_each_step():
    # (torch.set_num_threads also sets the count threads started later take:
    # left at the worker's, the rank's own threads would shrink to it)
    before = torch.get_num_threads()
    steps = host_step.HostSteps(torch.device("cuda", 0))
    steps._threads, steps._caller_threads = 1, max(2, before)
    item = host_step._Queued(0, "layers.0", 0, [], [])
    steps._waiting.append(item)
    steps._pending.append(item)
    try:
        steps._run_next()
        assert item.future.done() and torch.get_num_threads() == max(2, before)
    finally:
        torch.set_num_threads(before)


class _Event:
    """A CUDA event the GPU has passed, or not yet."""

    def __init__(self, passed: bool):
        self.passed = passed
        self.waited = False

    def query(self) -> bool:
        return self.passed

    def synchronize(self) -> None:
        self.waited = self.passed = True


def test_the_worker_takes_the_step_whose_gradients_are_home_that_the_forward_needs_first():
    steps = host_step.HostSteps(torch.device("cuda", 0))
    # (the place in the forward's order, whether its gradients are home)
    queued = [host_step._Queued(i, f"u{i}", rank, [_Event(home)], [])
              for i, (rank, home) in enumerate([(5, True), (2, False), (3, True), (4, True)])]
    steps._waiting.extend(queued)
    assert steps._next() is queued[2]       # the first needed of those home
    queued[1].ready[0].passed = True
    assert [steps._next() for _ in range(3)] == [queued[1], queued[3], queued[0]]
    late = [host_step._Queued(i, f"v{i}", rank, [_Event(False)], [])
            for i, rank in enumerate([9, 1])]
    steps._waiting.extend(late)
    assert steps._next() is late[0]         # none home: the one queued first
    assert steps._next() is late[1] and not steps._waiting


def test_a_queued_step_keeps_the_hyperparameters_it_was_queued_with():
    group = {"params": [], "lr": torch.tensor(0.01), "betas": (0.9, 0.999), "eps": 1e-8,
             "weight_decay": 0.1, "amsgrad": False, "maximize": False, "foreach": None}
    taken = host_step._hyperparameters(group)
    group["lr"].fill_(0.5)                  # a scheduler's in-place change, after
    group["weight_decay"] = 0.0
    assert taken == {"lr": pytest.approx(0.01), "betas": (0.9, 0.999), "eps": 1e-8,
                     "weight_decay": 0.1, "amsgrad": False, "maximize": False}
    assert isinstance(taken["lr"], float)


def test_non_blocking_is_refused_where_it_has_nothing_to_do_or_differs():
    host_step.check_non_blocking(True, 1.0)
    host_step.check_non_blocking(False, 0.0, offloads=False)
    with pytest.raises(ValueError, match="steps nothing on the host"):
        host_step.check_non_blocking(True, 0.0)
    with pytest.raises(ValueError, match="True or False; got 1"):
        host_step.check_non_blocking(1, 1.0)
    with pytest.raises(ValueError, match="same non_blocking"):
        host_step.check_non_blocking(True, 1.0, offloads=False)
