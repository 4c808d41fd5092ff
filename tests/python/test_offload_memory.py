"""Which of a module's tensors give their memory up to an offload, without a
GPU: those only the module holds (offload.held_elsewhere). The GPU tests
(test_gpu_offload.py) check the memory an offload then takes."""
import torch

from torch_uvm.offload import held_elsewhere, offload_plan


def held(module):
    plan = offload_plan(module)
    tensors = {id(t): t for _, _, own, _ in plan for _, t, _ in own}
    ids = held_elsewhere(tensors, plan)
    del tensors, plan
    return {name for name, t in module.named_parameters(remove_duplicate=False) if id(t) in ids}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8),
                               torch.nn.Linear(8, 16))


def test_a_module_that_alone_holds_its_tensors_gives_them_all_up():
    assert held(model()) == set()


def test_a_tie_inside_the_module_is_still_held_by_the_module_alone():
    m = model()
    m[2].weight = m[0].weight                 # tied embedding and head, both inside
    assert held(m) == set()


def test_a_tie_to_a_module_outside_keeps_its_memory():
    m = model()
    outside = torch.nn.Linear(8, 8)
    outside.weight = m[1].weight
    assert held(m) == {"1.weight"}


def test_a_variable_of_the_callers_keeps_its_memory():
    m = model()
    mine = m[2].bias
    assert held(m) == {"2.bias"}
    del mine
    assert held(m) == set()


def test_a_list_or_an_optimizer_holding_the_tensors_keeps_them():
    m = model()
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    assert held(m) == {name for name, _ in m.named_parameters()}
    del optimizer
    assert held(m) == set()


def test_a_tensor_an_autograd_graph_saved_keeps_its_memory():
    m = model()
    out = m[1](m[0](torch.tensor([1, 2]))).sum()     # the graph saves Linear 1's weight
    assert "1.weight" in held(m)
    out.backward()
    del out
    assert held(m) == set()


def test_a_state_dict_or_a_view_of_the_caller_keeps_its_memory():
    # they share the storage, not the tensor: its storage's users count them
    m = model()
    saved = m.state_dict()
    assert held(m) == {name for name, _ in m.named_parameters()}
    del saved
    view = m[2].weight.t()
    assert held(m) == {"2.weight"}
    del view
    assert held(m) == set()


def test_undo_writes_back_only_where_copy_can_write():
    # an expanded tensor's elements share memory and an inference tensor
    # refuses in-place writes: undo() gives those new memory instead
    from torch_uvm.offload import _kept_memory
    assert _kept_memory(torch.zeros(3), to_cpu=False)
    assert not _kept_memory(torch.zeros(3).expand(4, 3), to_cpu=False)
    with torch.inference_mode():
        made = torch.zeros(3)
    assert not _kept_memory(made, to_cpu=False)
    assert not _kept_memory(torch.empty(0), to_cpu=False)      # emptied by the offload
