"""The portable-kernel pass, cell by cell: the pytest plugin its child pytest loads
(`-p portable_cells`, tests/conftest.py KernelPass).

tests/kernel_cells.json lists, per notebook, the cells whose outputs can depend on PyTorch's CPU
kernels (tools/kernel_cells.py measures them). Under ATEN_CPU_CAPABILITY=default, strict nbval
runs those cells, their outputs compared as in the native pass, and the cells they need, which
must run without raising (their outputs are the native pass's to compare): every other cell of
the notebook is deselected, and a notebook with no listed cell is not started.

The cells a cell needs (`needed`), by the names cells bind and read (tests/cell_names.py):
- for each name a needed cell reads, the last earlier cell that bound it;
- each earlier cell that launches ranks (`.run(`, `launch(`, `try_fix(`, `%%ddp`, `doctor(`,
  `watch(`) and reads a name a needed cell reads, other than a module, a lesson or a scenario
  (the names bound by an import, `get_lesson(...)`, `....scenario(...)` or `....LESSON`): its
  ranks may have written what the needed cell reads through that name (a trace in a folder);
- each earlier cell that binds no name, launches nothing and reads only what imports bound (a
  seed, a setting, a magic: what it changes, no name shows);
until nothing more is needed.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAUNCHES = re.compile(r"\.run\(|\blaunch\(|\btry_fix\(|%%ddp|\bdoctor\(|\bwatch\(")
STATIC = re.compile(r"^\s*(\w+)\s*=\s*(?:.*\bget_lesson\(|.*\.scenario\(|[\w.]*\.LESSON\s*$)", re.M)


def kernel_cells():
    """tools/kernel_cells.py, loaded once (the list, its hash, the command that regenerates it)."""
    if "kernel_cells" not in sys.modules:
        spec = importlib.util.spec_from_file_location("kernel_cells", REPO / "tools" / "kernel_cells.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["kernel_cells"]


def needed(sources: list[str], targets) -> set[int]:
    """The code cells (indices into `sources`) that the cells `targets` need, `targets` included."""
    from cell_names import names

    cells = [names(s) for s in sources]
    static = [set(STATIC.findall(s)) | c.imports for s, c in zip(sources, cells)]
    launches = [bool(LAUNCHES.search(s)) for s in sources]
    imported = set().union(*(c.imports for c in cells)) if cells else set()
    need = set(targets) | {j for j in range(max(targets, default=0)) if not cells[j].binds
                           and not launches[j] and cells[j].reads <= imported | {"get_ipython"}}
    todo = list(need)
    while todo:
        i = todo.pop()
        for name in cells[i].reads:
            binder = next((j for j in range(i - 1, -1, -1) if name in cells[j].binds), None)
            if binder is None:
                continue
            kind_static = name in static[binder]
            found = {binder} if kind_static else {binder} | {
                j for j in range(binder + 1, i) if launches[j] and name in cells[j].reads}
            for j in found - need:
                need.add(j)
                todo.append(j)
    return need


def plan(path: Path, listed: dict) -> tuple[set[int], set[int]]:
    """(the cells compared strictly, the cells run only because they are needed) of a notebook."""
    import nbformat

    entry = listed["notebooks"].get(path.name)
    if not entry or not entry["cells"]:
        return set(), set()
    sources = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    strict = set(entry["cells"])
    return strict, needed(sources, strict) - strict


# --- The child pytest's plugin ----------------------------------------------------------------

def pytest_collection_modifyitems(session, config, items):
    listed = kernel_cells().read_list()
    plans, keep = {}, []
    for item in items:
        if not hasattr(item, "cell_num"):
            keep.append(item)
            continue
        path = Path(str(item.fspath))
        if path not in plans:
            plans[path] = plan(path, listed)
        strict, run_only = plans[path]
        if item.cell_num in strict:
            keep.append(item)
        elif item.cell_num in run_only:
            item.options["check"] = False  # it must not raise; its outputs are the native pass's
            keep.append(item)
    dropped = [it for it in items if it not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
    strict_n = sum(len(s) for s, _ in plans.values())
    run_n = sum(len(r) for _, r in plans.values())
    print(f"portable pass: {strict_n} cells compared strictly and {run_n} run for them, in "
          f"{sum(1 for s, _ in plans.values() if s)} of {len(plans)} notebooks "
          f"({len(dropped)} cells left to the native pass)", file=sys.stderr)
