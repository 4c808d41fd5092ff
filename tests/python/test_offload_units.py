"""offload's units without a GPU: which module each tensor streams with
(units=), the largest unit's bytes, and bad units= refused by name."""
import pytest
import torch

from torch_uvm.offload_units import make_units, offload_plan, unit_roots


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.proj(x))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight           # tied


def roots_by_name(model, units=None):
    names = {id(m): n for n, m in model.named_modules()}
    return {names[i]: r[0] for i, r in unit_roots(model, units).items() if i in names}


def test_each_submodule_with_tensors_is_its_own_unit_by_default():
    model = Net()
    roots = roots_by_name(model)
    assert roots["blocks.0.proj"] == "blocks.0.proj" and roots["embed"] == "embed"
    units = make_units(offload_plan(model), unit_roots(model), {
        id(t): t for t in list(model.parameters()) + list(model.buffers())})
    assert [u.name for u in units] == ["embed", "blocks.0.proj", "blocks.0.norm",
                                       "blocks.1.proj", "blocks.1.norm", "head"]


@pytest.mark.parametrize("units", [Block, (Block,), ["Block"], "Block",
                                   lambda m: isinstance(m, Block)])
def test_a_matched_module_streams_with_everything_below_it(units):
    model = Net()
    roots = roots_by_name(model, units)
    assert roots["blocks.0.proj"] == roots["blocks.0.norm"] == "blocks.0"
    assert roots["blocks.1.norm"] == "blocks.1"
    assert roots["embed"] == "embed" and roots["head"] == "head"
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    made = make_units(offload_plan(model), unit_roots(model, units), tensors)
    assert [u.name for u in made] == ["embed", "blocks.0", "blocks.1", "head"]
    block = made[1]
    assert block.module is model.blocks[0]
    assert block.members == [model.blocks[0].proj, model.blocks[0].norm]
    assert len(block.targets) == 4                      # weight and bias of each
    # the tied weight: a target of both units that hold it, counted once in each
    assert made[0].targets[0] is made[3].targets[0]


def test_the_outermost_match_wins_and_a_module_in_two_units_streams_on_its_own():
    model = Net()
    roots = roots_by_name(model, (Block, torch.nn.Linear))
    assert roots["blocks.0.proj"] == "blocks.0"          # the Block, not the Linear in it
    assert roots["head"] == "head"                        # a Linear on its own
    # one module in two blocks: neither block's hooks see its calls from the other
    model.blocks[1].proj = model.blocks[0].proj
    roots = unit_roots(model, Block)
    assert roots[id(model.blocks[0].proj)] == ("blocks.0.proj", model.blocks[0].proj)
    assert roots[id(model.blocks[1].norm)][0] == "blocks.1"
    # the same block in two places is one unit, its own root in both
    model.blocks[1] = model.blocks[0]
    assert unit_roots(model, Block)[id(model.blocks[0].proj)][0] == "blocks.0"


def test_a_container_that_never_runs_is_no_unit():
    model = Net()                                         # blocks: a ModuleList
    assert roots_by_name(model, lambda m: isinstance(m, (torch.nn.ModuleList, Block)))[
        "blocks.0.proj"] == "blocks.0"                    # its Blocks are, not it
    with pytest.raises(ValueError, match="runs a forward of its own"):
        unit_roots(model, torch.nn.ModuleList)


def largest_unit(model, units=None):
    """(name, bytes) of the largest unit, as offload sizes its window."""
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    u = max(make_units(offload_plan(model), unit_roots(model, units), tensors),
            key=lambda u: u.nbytes)
    return u.name, u.nbytes


def test_the_largest_unit_counts_a_tensor_it_holds_twice_once():
    model = Net()
    assert largest_unit(model) == ("embed", 16 * 8 * 4)
    block = Block()
    block.norm.weight = block.proj.bias                       # (both [8])
    assert largest_unit(block, Block) == \
        ("Block", (8 * 8 + 8 + 8) * 4)                        # the shared one once
    two = torch.nn.Sequential(Block(), Block())
    two[0].norm.weight = two[0].proj.bias
    assert largest_unit(two, torch.nn.Sequential) == \
        ("Sequential", 2 * (8 * 8 + 8 + 8 + 8) * 4 - 8 * 4)


def test_bad_units_are_refused_by_name():
    with pytest.raises(TypeError, match="units= takes module classes, their names .* got 3"):
        unit_roots(Net(), 3)
    with pytest.raises(TypeError, match="units= takes"):
        unit_roots(Net(), [])
    with pytest.raises(ValueError, match=r"units=\['DecoderLayer'\] matches no submodule of Net "
                                         r"that holds parameters or buffers and runs a forward of its own .*'Block'"):
        unit_roots(Net(), ["DecoderLayer"])
    with pytest.raises(ValueError, match="matches no submodule"):
        unit_roots(Net(), torch.nn.Dropout)


def test_sizing_the_largest_unit_leaves_no_holder_of_the_weights():
    """offload sizes its largest unit before it asks which tensors something
    else holds (those keep their memory beside their homes): the unit it
    sized must be gone by then, or its tensors count as held and the host
    holds them twice. A unit kept alive is seen as a holder (the check can
    fail)."""
    from torch_uvm.offload import _largest_unit, held_elsewhere
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 128))
    plan = offload_plan(model)
    roots = unit_roots(model, None)
    tensors = {id(t): t for _, _, own, _ in plan for _, t, _ in own}
    assert _largest_unit(plan, roots, tensors) == ("1", (64 * 128 + 128) * 4)
    assert held_elsewhere(tensors, plan) == set()
    kept = max(make_units(plan, roots, tensors), key=lambda u: u.nbytes)
    assert held_elsewhere(tensors, plan) == {id(model[1].weight), id(model[1].bias)}
    del kept
