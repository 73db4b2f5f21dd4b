"""The diagnostic wing's floors (ddp_lab/doctor; its manual is doctor/__init__.py), enforced as
tests/test_layers.py enforces the package's. Every module's imports are read with `ast`:

    face    __init__, __main__, cli      may import anything of the wing
    exam/   the doctor's run              exam, checks, the ground (never watch)
    watch/  watch                         watch, checks, the ground (never exam)
    checks/ the registry                  checks, the ground; a check itself only the floor
                                          (checks/api.py, context.py), its own `_<name>_*` parts
                                          and the user's line (userline.py, frames.py)
    ground  report, userline, frames, ... the ground only

Also: no import cycle between these folders; a relative import inside a function only where
startup cost needs it, with a comment saying so; no function outside the public API with more
than 8 parameters; "the user's line" (`file:line: text`) written only in userline.py and "which
frame is the user's" decided only in frames.py; modules under 300 lines, no two with one name."""
import ast
from pathlib import Path

import ddp_lab.doctor as wing
from ddp_lab.doctor import frames, userline
from ddp_lab.doctor.checks import api
from ddp_lab.doctor.exam import run
from ddp_lab.doctor.watch import core
from ddp_lab.launching import launcher
from test_layers import find_cycle, import_graph

WING = Path(wing.__file__).parent
NAME = wing.__name__
FACE = ("__init__", "__main__", "cli")
FOLDERS = ("exam", "watch", "checks")
MAY_IMPORT = {"face": {"face", "exam", "watch", "checks", "ground"}, "exam": {"exam", "checks", "ground"},
              "watch": {"watch", "checks", "ground"}, "checks": {"checks", "ground"}, "ground": {"ground"}}
CHECKS_FLOOR = ("api", "context", "__init__")  # what every check stands on
USER_LINE = ("userline", "frames")  # the user's line, and which frame is the user's
WATCH = Path(core.__file__).parent
# the public API, doctor() and watch(): their signatures are the user's
PUBLIC = {f"{Path(run.__file__).relative_to(WING)}:{run.doctor.__name__}",
          f"{(WATCH / '__init__.py').relative_to(WING)}:watch",
          # ddp_lab.watch("train.py", ...) is this function: the public call's keywords, one by one
          f"{(WATCH / 'script.py').relative_to(WING)}:watch_script"}
MOST_PARAMETERS = 8
MOST_LINES = 300


def floor(module: str) -> str | None:
    """"face", "exam", "watch", "checks" or "ground"; None outside the wing."""
    if module != NAME and not module.startswith(NAME + "."):
        return None
    first = module[len(NAME) + 1:].split(".")[0] if module != NAME else "__init__"
    return "face" if first in FACE else first if first in FOLDERS else "ground"


def wing_graph() -> dict[str, set[str]]:
    return {m: {t for t, _ in targets if floor(t)} for m, targets in import_graph().items()
            if floor(m)}


def modules():
    for path in sorted(WING.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_each_floor_imports_only_the_floors_below_it():
    bad = [f"{m} -> {t}" for m, targets in wing_graph().items() for t in targets
           if floor(t) not in MAY_IMPORT[floor(m)]]
    assert bad == [], "the wing's floors (doctor/__init__.py): " + "; ".join(bad)


def test_a_check_imports_only_the_floor_its_own_parts_and_the_users_line():
    bad = []
    for m, targets in wing_graph().items():
        parts = m.split(".")
        if floor(m) != "checks" or parts[-1] in CHECKS_FLOOR or m == f"{NAME}.checks":
            continue
        own = parts[-1].lstrip("_").split("_")[0]
        for t in targets:
            leaf = t.split(".")[-1]
            if floor(t) == "checks" and (leaf in CHECKS_FLOOR[:2] or leaf.startswith(f"_{own}")):
                continue
            if floor(t) == "ground" and leaf in USER_LINE:
                continue
            bad.append(f"{m} -> {t}")
    assert bad == [], f"a check imports {api.__name__} (and its context), its own parts and the user's line"


def test_no_import_cycle_between_the_wings_folders():
    edges = {}
    for m, targets in wing_graph().items():
        edges.setdefault(floor(m), set()).update(floor(t) for t in targets if floor(t) != floor(m))
    assert find_cycle(edges) is None, find_cycle(edges)


def _comment_near(lines: list[str], node) -> str:
    return " ".join(lines[max(0, node.lineno - 2):node.end_lineno])


def test_a_relative_import_inside_a_function_says_its_startup_cost():
    found = []
    for path, tree in modules():
        lines = path.read_text().splitlines()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if (isinstance(node, ast.ImportFrom) and node.level
                            and "startup" not in _comment_near(lines, node)):
                        found.append(f"{path.relative_to(WING)}:{node.lineno}")
    assert found == [], "import at the module's top, or say in a comment which startup cost it saves"


def parameters(fn) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return [n for n in names if n not in ("self", "cls")]


def test_no_function_outside_the_public_api_takes_more_than_8_parameters():
    found = []
    for path, tree in modules():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(WING)}:{fn.name}"
                if where not in PUBLIC and len(parameters(fn)) > MOST_PARAMETERS:
                    found.append(f"{where} ({len(parameters(fn))})")
    assert found == [], "bundle them (the doctor's Subject, the function API's StepRun): " + ", ".join(found)


def line_builders(tree) -> list[int]:
    """f-strings of the user's line's shape: `{file}:{line}: {text}` or `{file}:{line} in {fn}`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            v = node.values
            for i in range(len(v) - 3):
                if (isinstance(v[i], ast.FormattedValue) and isinstance(v[i + 1], ast.Constant)
                        and v[i + 1].value == ":" and isinstance(v[i + 2], ast.FormattedValue)
                        and isinstance(v[i + 3], ast.Constant)
                        and str(v[i + 3].value).startswith((": ", " in "))):
                    found.append(node.lineno)
    return found


def test_the_users_line_is_written_in_userline_only():
    found = [f"{path.relative_to(WING)}:{n}" for path, tree in modules()
             if path.stem != "userline" for n in line_builders(tree)]
    assert found == [], f"write the user's line with {userline.__name__}"
    assert line_builders(ast.parse('f"{a}:{b}: {c}"; f"{a}:{b} in {c}"; f"{a}:{b}"')) == [1, 1]


def test_which_frame_is_the_users_is_decided_in_frames_only():
    """The tells: a path fragment of installed packages or of torch's own files, and a function
    named for the user's frame, code or site."""
    found = []
    for path, tree in modules():
        if path.stem in USER_LINE:
            continue
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(
            n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body and isinstance(
            n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and ("site-packages" in node.value
                                                        or node.value.startswith("/torch/"))):
                found.append(f"{path.relative_to(WING)}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") in (
                    "users", "is_user", "user_site", "user_frame_in", "is_module_code"):
                found.append(f"{path.relative_to(WING)}:{node.lineno} def {node.name}")
    assert found == [], f"decide which frame is the user's in {frames.__name__}"


def test_modules_are_short_and_each_name_is_one_module():
    long = [f"{p.relative_to(WING)} ({n})" for p in WING.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MOST_LINES]
    assert long == [], f"modules of one concern, under {MOST_LINES} lines"
    names = [p.stem for p in WING.rglob("*.py") if p.stem not in ("__init__", "__main__")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_the_floors_are_read_as_said():
    assert floor(NAME) == "face" and floor(f"{NAME}.cli") == "face"
    assert floor(f"{NAME}.exam.run") == "exam" and floor(f"{NAME}.checks.api") == "checks"
    assert floor(userline.__name__) == "ground" and floor(launcher.__name__) is None
    assert find_cycle({"exam": {"checks"}, "checks": {"exam"}}) == ["checks", "exam", "checks"]
