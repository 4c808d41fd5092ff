"""The Python package's shape, read from its source without running it:
its modules import each other in one direction (no circle, the imports made
only for type checking counted too), and none imports another's underscored
names (a module's private names are its own)."""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "torch_uvm")


def modules():
    return sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py"))


def sibling_imports(name):
    """(the sibling module, the names taken from it) for each import of
    torch_uvm's own modules in `name`, wherever it stands in the file."""
    tree = ast.parse(open(os.path.join(PACKAGE, name + ".py")).read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:                        # from .x import a, b
                found.append((node.module.split(".")[0], [a.name for a in node.names]))
            else:                                  # from . import x, y
                found += [(a.name, []) for a in node.names]
    return [(m, names) for m, names in found if m in modules()]


def test_the_modules_import_each_other_in_one_direction():
    graph = {m: {s for s, _ in sibling_imports(m)} - {m} for m in modules() if m != "__init__"}
    graph = {m: {s for s in deps if s != "__init__"} for m, deps in graph.items()}
    path = []

    def visit(m, seen):
        if m in path:
            return path[path.index(m):] + [m]
        if m in seen:
            return None
        seen.add(m)
        path.append(m)
        for d in sorted(graph.get(m, ())):
            circle = visit(d, seen)
            if circle:
                return circle
        path.pop()
        return None
    seen = set()
    for m in sorted(graph):
        circle = visit(m, seen)
        assert circle is None, f"torch_uvm's modules import each other in a circle: {circle}"


@pytest.mark.parametrize("name", [m for m in modules()])
def test_no_module_imports_another_modules_underscored_names(name):
    taken = [(m, n) for m, names in sibling_imports(name) for n in names
             if n.startswith("_") and not n.startswith("__")]
    assert not taken, f"torch_uvm/{name}.py takes private names of other modules: {taken}"
