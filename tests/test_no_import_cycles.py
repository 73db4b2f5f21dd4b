"""No import cycle inside ddp_lab, counting imports inside functions: every module's imports
(at any depth, relative and absolute) are read with `ast`, and the graph must be acyclic."""
import ast
from pathlib import Path

import ddp_lab

ROOT = Path(ddp_lab.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The ddp_lab modules `path` imports, anywhere in it (inside functions too). Importing
    `a.b` also runs package `a` first; that implicit step is not counted (every submodule would
    otherwise be in a cycle with a package __init__ that imports it), but `from a import name`
    of a name that is not a submodule is an import of `a` itself."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {f for f in found if f in modules and f != name}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: imported(path, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_relative_and_lazy_imports_are_read():
    graph = import_graph()
    from ddp_lab.launching import launcher, processes, results, torchrun

    imported = graph[launcher.__name__]
    assert results.__name__ in imported  # `from .results import ...`
    assert torchrun.__name__ in imported  # inside a function
    assert processes.__name__ in imported  # `from . import processes`
    assert ddp_lab.__name__ not in imported


def test_no_import_cycle_in_ddp_lab():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
