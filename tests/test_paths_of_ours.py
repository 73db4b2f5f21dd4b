"""No path or module name of ddp_lab is written as a string outside ddp_lab/launching/frames.py,
which derives them from `__name__` and `__file__`: a filter written as "ddp_lab/_rank.py" keeps
passing every test after the file moves, and silently stops filtering (issue 21). Code names a
place of ours by its module (`frames.place(module)`, `module.__name__`, `module.__file__`).

Read with `ast`: every string constant of the package, the tests, the tools and the benchmarks
that is not a docstring (prose may name a module: it cannot break)."""
import ast
import re
from pathlib import Path

import ddp_lab
from ddp_lab.launching import frames

PACKAGE = Path(ddp_lab.__file__).parent
REPO = PACKAGE.parent
SCANNED = ("ddp_lab", "tests", "tools", "benchmarks")
_BASENAME = re.compile(r"\b(\w+)\.py\b")


def modules_of_ours() -> tuple[set[str], set[str]]:
    """(the names of the package's submodules and subpackages below ddp_lab, the stems of its
    files)."""
    names, stems = set(), set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        names.update(parts[:1] if parts[0] != "__init__" else ())
        stems.add(path.stem)
    return names, stems - {"__init__", "__main__"}


def _docstrings(tree) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def strings_naming_ours(source: str, names: set[str], stems: set[str]) -> list[tuple[int, str]]:
    """(line, string) of each string constant that is not a docstring and names a module of
    ours: a path (`ddp_lab/...`, `probes.py`) or a dotted name (`ddp_lab.launching...`)."""
    package = PACKAGE.name
    dotted = re.compile(rf"\b{package}\.(\w+)")
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            if (f"{package}/" in text or any(m in names for m in dotted.findall(text))
                    or any(s in stems for s in _BASENAME.findall(text))):
                found.append((node.lineno, text))
    return found


def test_no_string_names_a_module_of_ours_outside_frames():
    names, stems = modules_of_ours()
    owner = Path(frames.__file__).resolve()
    found = []
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.resolve() != owner:
                found += [f"{path.relative_to(REPO)}:{line}: {text[:80]!r}"
                          for line, text in strings_naming_ours(path.read_text(), names, stems)]
    assert found == [], "name these by their module (frames.place, __name__, __file__):\n" + "\n".join(found)


def test_the_check_catches_each_spelling():
    from ddp_lab.instruments import probes

    names, stems = modules_of_ours()
    package, probes_py = PACKAGE.name, Path(probes.__file__).name
    source = (f'"""A docstring may name {package}/ and {probes_py}."""\n'
              f'OWN = ("{package}/doctor/", "x")\n'
              f'CHILD = "{package}.launching.{probes.__name__.rpartition(".")[2]}"\n'
              f'SHOWN = "{probes_py}"\n'
              f'FINE = ("{package}.launch(fn)", "torch/distributed", "models.py")\n')
    assert sorted(line for line, _ in strings_naming_ours(source, names, stems)) == [2, 3, 4]


def test_places_are_derived_and_found_in_frames_as_ranks_print_them():
    from ddp_lab.doctor import frames as doctors
    from ddp_lab.instruments import probes
    from ddp_lab.launching import child

    assert frames.place(child) == f"{PACKAGE.name}/launching/{Path(child.__file__).name}"
    assert frames.place(doctors.__file__.rpartition("/")[0]).endswith("/doctor/")
    assert frames.in_places(child.__file__, frames.ENGINE)
    assert frames.in_places(frames.place(probes), (doctors.PROBES,))  # as sanitize cuts a path
    assert not frames.in_places("/x/not_" + Path(child.__file__).name, frames.ENGINE)
    assert frames.launchers("<string>") and frames.launchers(child.__file__, "child_main")
    assert frames.CHILD == child.__name__ and frames.RANK_ENTRY == child.child_main.__name__
