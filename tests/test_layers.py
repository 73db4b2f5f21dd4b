"""The package's layers, enforced. Every module's imports (at any depth, inside functions too,
relative and absolute) are read with `ast`; the graph must have no cycle, and each part may
import only the parts below it:

    launching    nothing else of ddp_lab
    instruments  launching
    course       launching, instruments; the lessons only through the registry's discovery
    lessons      course, instruments, and launching's public names (never its engine modules
                 processes, forkserver, child, frames, nor a `_private` name of any module)
    doctor       launching, instruments, the registry; never a lesson
    kit          launching, instruments (`ddp-lab check` asks deepspeed_ops), the registry
The top (`ddp_lab/__init__.py`, `__main__.py`, `cli.py`) is the public face and may import all.
"""
import ast
from pathlib import Path

import ddp_lab

ROOT = Path(ddp_lab.__file__).parent
PARTS = ("launching", "instruments", "course", "kit", "lessons", "doctor")
ENGINE = ("processes", "forkserver", "child", "frames")  # launching's private engine
REGISTRY = ("course", "registry")
MAY_IMPORT = {
    "launching": set(),
    "instruments": {"launching"},
    "course": {"launching", "instruments"},
    "lessons": {"course", "instruments", "launching"},
    "doctor": {"launching", "instruments"},
    "kit": {"launching", "instruments"},
}
SAID = {"launching": "nothing else of the package", "instruments": "launching",
        "course": "launching, instruments (the lessons only through the registry's discovery)",
        "lessons": "course, instruments, launching's public names",
        "doctor": "launching, instruments, the registry", "kit": "launching, instruments, the registry"}
RULES = "; ".join(f"{part} may import {said}" for part, said in SAID.items())


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: set[str], root: Path = ROOT) -> set[tuple[str, str]]:
    """(module, name) for every import of a module of the package that `path` makes, anywhere
    in it (inside functions too); `name` is what `from module import name` takes ("" for a
    plain import or a submodule). Importing `a.b` also runs package `a` first; that implicit
    step is not counted (every submodule would otherwise be in a cycle with a package
    __init__ that imports it), but `from a import name` of a name that is not a submodule is
    an import of `a` itself."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update((a.name, "") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add((sub, "") if sub in modules else (base, alias.name))
    return {(m, n) for m, n in found if m in modules and m != name}


def import_graph(root: Path = ROOT) -> dict[str, set[tuple[str, str]]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    return {name: imports(path, set(files), root) for name, path in files.items()}


def part_of(module: str) -> str:
    """"launching", "course", ... or "top" (the package's face: __init__, __main__, cli)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PARTS else "top"


def _is_registry(module: str) -> bool:
    return tuple(module.split(".")[1:]) == REGISTRY


def forbidden(graph: dict[str, set[tuple[str, str]]]) -> list[str]:
    """Every import that breaks a layer rule, as "importer -> imported (why)"."""
    out = []
    for importer, targets in sorted(graph.items()):
        mine = part_of(importer)
        if mine == "top":
            continue
        for target, name in sorted(targets):
            theirs, why = part_of(target), ""
            if theirs == mine:
                continue
            if _is_registry(importer) and target.split(".")[1:] == ["lessons"]:
                continue  # the registry's discovery of the lessons
            if _is_registry(target) and mine in ("doctor", "kit"):
                continue
            if theirs not in MAY_IMPORT[mine]:
                why = f"{mine} may import {SAID[mine]}"
            elif mine == "lessons" and theirs == "launching" and (
                    target.rpartition(".")[2] in ENGINE or name.startswith("_")):
                why = "a lesson uses launching's public names only"
            elif name.startswith("_"):
                why = f"{name} is private to {target}"
            if why:
                out.append(f"{importer} -> {target}{'.' + name if name else ''} ({why})")
    return out


def find_cycle(graph: dict[str, set]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    edges = {node: {t if isinstance(t, str) else t[0] for t in targets} for node, targets in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_relative_and_lazy_imports_are_read():
    from ddp_lab.launching import launcher, processes, results, torchrun

    imported = {m for m, _ in import_graph()[launcher.__name__]}
    assert results.__name__ in imported  # `from .results import ...`
    assert torchrun.__name__ in imported  # inside a function
    assert processes.__name__ in imported  # `from . import processes`
    assert ddp_lab.__name__ not in imported


def test_no_import_cycle_in_ddp_lab():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_each_part_imports_only_the_parts_below_it():
    assert forbidden(import_graph()) == [], f"the rules: {RULES}"


def _write(root: Path, files: dict[str, str]) -> Path:
    """Modules of a synthetic package at `root` (every folder a package), named without .py."""
    for rel, source in files.items():
        path = root / f"{rel}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in [path.parent, *path.parent.parents]:
            if folder == root.parent:
                break
            (folder / "__init__.py").touch()
        path.write_text(source)
    return root


def test_a_forbidden_import_is_reported(tmp_path):
    root = _write(tmp_path / ROOT.name, {
        "launching/launcher": "from . import processes\n",
        "launching/processes": "",
        "launching/rankinfo": "def rank_info(): ...\n",
        "course/registry": "def lessons():\n    from .. import lessons\n",
        "course/plots": "",
        "instruments/probes": "from ..launching.rankinfo import rank_info\n",
        "lessons/l99_x/runs": "from ...course.plots import figure\n",
        "doctor/report": "from ..course.registry import lessons\n",
    })
    assert forbidden(import_graph(root)) == []  # what the rules allow
    _write(root, {  # one forbidden import of each kind
        "launching/results": "def show():\n    from ..course import plots\n",
        "lessons/l99_x/figures": "from ...launching import processes\n"
                                 "from ...launching.rankinfo import _env\n",
        "course/tour": "from ..lessons.l99_x import runs\n",
        "kit/site": "from ..doctor import report\n",
        "doctor/static": "from ..lessons.l99_x import runs\n",
    })
    p = ROOT.name
    assert forbidden(import_graph(root)) == [
        f"{p}.course.tour -> {p}.lessons.l99_x.runs (course may import {SAID['course']})",
        f"{p}.doctor.static -> {p}.lessons.l99_x.runs (doctor may import {SAID['doctor']})",
        f"{p}.kit.site -> {p}.doctor.report (kit may import {SAID['kit']})",
        f"{p}.launching.results -> {p}.course.plots (launching may import {SAID['launching']})",
        f"{p}.lessons.l99_x.figures -> {p}.launching.processes (a lesson uses launching's public names only)",
        f"{p}.lessons.l99_x.figures -> {p}.launching.rankinfo._env (a lesson uses launching's public names only)",
    ]
