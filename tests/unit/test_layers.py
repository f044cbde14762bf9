"""The import graph points one way (README "Layout"): every labkit module imports only from its own floor or
below, function-local imports included, and no two modules import each other in a loop. A new up-pointing
import fails here naming file, line and both floors."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "labkit"

# Floors, bottom to top (the first matching prefix wins). Same floor = allowed both ways, but no cycles.
FLOORS = [
    ("labkit.compat", 0), ("labkit.config", 0), ("labkit.failpoints", 0), ("labkit.pids", 0), ("labkit.doctor", 0),
    ("labkit.provenance", 0),
    ("labkit.cluster", 0),
    ("labkit.models", 1), ("labkit.tasks", 1),  # a task batches with the model's tokenizer
    ("labkit.engine", 2), ("labkit.trainer", 2),
    ("labkit.sync", 3),
    ("labkit.mtp", 4),
    ("labkit.workbench", 5),
    ("labkit.lab", 6),  # what measures, reports and experiments on the library
    ("labkit.cli", 7), ("labkit", 7),
]


def floor(mod: str) -> int:
    for prefix, f in FLOORS:
        if mod == prefix or mod.startswith(prefix + "."):
            return f
    raise AssertionError(f"{mod} is on no floor: add it to FLOORS")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path):
    """(line, imported labkit module) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text())
    me = module_name(path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("labkit"):
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("labkit"):
                continue
            for a in node.names:  # `from labkit.sync import atomic` imports the module labkit.sync.atomic
                sub = f"{base}.{a.name}"
                path = PKG.parent / sub.replace(".", "/")
                yield node.lineno, sub if path.with_suffix(".py").exists() or path.is_dir() else base


def sources():
    return [p for p in sorted(PKG.rglob("*.py")) if "sglang_cpu" not in p.parts]


def test_no_import_points_up_a_floor():
    bad = []
    for p in sources():
        me = module_name(p)
        for line, mod in sorted(set(imports(p))):
            if floor(mod) > floor(me):
                bad.append(f"{p.relative_to(PKG.parent)}:{line} {me} (floor {floor(me)}) imports {mod} "
                           f"(floor {floor(mod)})")
    assert not bad, "imports pointing up a floor:\n" + "\n".join(bad)


def reaches(graph: dict, start: str, goal: str) -> bool:
    """Whether `goal` is reachable from `start` along the graph's edges."""
    todo, seen = [start], set()
    while todo:
        n = todo.pop()
        if n == goal:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(graph.get(n, ()))
    return False


def import_graph() -> dict[str, set[str]]:
    """Module -> the labkit modules it imports. A package's __init__ importing its own submodules is how a package
    shows its face, not a cycle: such an edge is left out, unless the submodule imports the package back (itself or
    through other modules; `from labkit.sync import NAME` for a NAME defined in labkit/sync/__init__.py), which
    makes it a loop through the package's face (labkit.sync -> labkit.sync.atomic -> labkit.sync)."""
    graph = {module_name(p): {m for _, m in imports(p)} - {module_name(p)} for p in sources()}
    face = {(me, d) for me, deps in graph.items() for d in deps if d.startswith(me + ".")}
    for me, d in face:
        graph[me].discard(d)
    kept, changed = set(), True
    while changed:  # an edge kept can make another package's face edge part of a loop: until nothing changes
        changed = False
        for me, d in sorted(face - kept):
            if reaches(graph, d, me):
                graph[me].add(d)
                kept.add((me, d))
                changed = True
    return graph


def test_no_import_cycles():
    graph = import_graph()
    seen, stack, cycles = set(), [], []

    def visit(n):
        if n in stack:
            cycles.append(stack[stack.index(n):] + [n])
            return
        if n in seen or n not in graph:
            return
        seen.add(n)
        stack.append(n)
        for d in sorted(graph[n]):
            visit(d)
        stack.pop()

    for n in sorted(graph):
        visit(n)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


@pytest.mark.parametrize("mod,expected", [("labkit.sync.plan", 3), ("labkit.workbench.core", 5),
                                          ("labkit.lab.bench.sync", 6), ("labkit", 7)])
def test_floor_map(mod, expected):
    assert floor(mod) == expected
