"""Which notebook cells print something that depends on PyTorch's CPU kernels, measured, and the
list the suite's portable-kernel pass runs (tests/kernel_cells.json).

    .venv/bin/python tools/kernel_cells.py            # re-measure the notebooks whose entry is stale
    .venv/bin/python tools/kernel_cells.py --all      # every notebook
    .venv/bin/python tools/kernel_cells.py notebooks/13_hangs.ipynb [...]
    .venv/bin/python tools/kernel_cells.py --check    # name the stale entries; exit 1 if any

Each notebook runs under strict nbval (pyproject's options, notebooks/sanitize.cfg) three times:
ATEN_CPU_CAPABILITY=default (the portable kernels), =avx2, and this CPU's own (the variable
unset; AVX512 on the course's Xeon). Every code cell's outputs are kept as nbval compares them
(sanitized, keyed by stream or MIME type), and a cell whose outputs differ between any two of the
three is kernel-dependent. The list also keeps, by a rule, the cells that print a float read from
a run (`float_cells`: the figures whose precision the portable pass protects), so it is never
empty where a lesson prints such figures. An entry carries its notebook's content hash (the code
cells' sources and committed outputs): when a notebook changes, the suite's
tests/test_notebooks_portable.py fails until its entry is measured again (this command, no
argument). The portable pass (tests/portable_cells.py) runs the listed cells and the cells they
need, found by the names cells bind and read.

The tool is also the pytest plugin each of its runs loads (`-p kernel_cells`): it records every
cell's outputs for the run's capability into $KERNEL_CELLS_RECORD.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIST = REPO / "tests" / "kernel_cells.json"
# name -> ATEN_CPU_CAPABILITY (None: unset, this CPU's own)
CAPABILITIES = {"default": "default", "avx2": "avx2", "native": None}
COMMAND = ".venv/bin/python tools/kernel_cells.py"


# --- The list --------------------------------------------------------------------------------

def notebooks() -> list[Path]:
    return sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def code_cells(path: Path) -> list:
    import nbformat

    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def content_hash(path: Path) -> str:
    """The code cells' sources and committed outputs (what nbval runs and compares): a markdown
    edit or a new execution time leaves it; a changed cell or a re-executed output does not."""
    cells = [[c.source, c.get("outputs", [])] for c in code_cells(path)]
    return hashlib.sha256(json.dumps(cells, sort_keys=True).encode()).hexdigest()[:16]


def read_list() -> dict:
    if not LIST.exists():
        return {"notebooks": {}}
    return json.loads(LIST.read_text())


def stale(listed: dict | None = None) -> dict[str, str]:
    """Notebook name -> why its entry is stale (changed, new, or gone)."""
    entries = (listed or read_list())["notebooks"]
    names = {p.name: p for p in notebooks()}
    out = {}
    for name, path in names.items():
        if name not in entries:
            out[name] = "no entry"
        elif entries[name]["hash"] != content_hash(path):
            out[name] = "changed since measured"
    out.update({name: "no such notebook" for name in entries if name not in names})
    return out


# --- A float read from a run, printed ----------------------------------------------------------

_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d{2,}(?![\w.])")
_UNITS = re.compile(r"\d+\.\d+ ?(?:s|ms|MB|MiB|GiB|KiB|%)(?!\w)")


def float_cells(path: Path) -> list[int]:
    """The rule: a code cell whose committed text output shows a decimal number with two or more
    decimals that no source writes (not a literal of the package's code or of the notebook's
    cells: a threshold, a learning rate, a source listing shown), once nbval's sanitizer is
    applied and seconds, sizes and percentages (the run's timing and memory, not its arithmetic)
    are set aside. Such a figure was computed by tensors, in a rank or in the notebook; the same
    digits under the portable kernels are what the pass protects."""
    sanitize = _sanitizer()
    cells = code_cells(path)
    literals = _package_literals() | {m for c in cells for m in _FLOAT.findall(c.source)}
    out = []
    for i, cell in enumerate(cells):
        text = _UNITS.sub("", sanitize(_text_of(cell.get("outputs", []))))
        if set(_FLOAT.findall(text)) - literals:
            out.append(i)
    return out


def _package_literals() -> set[str]:
    found = set()
    for source in (REPO / "ddp_lab").rglob("*.py"):
        found |= set(_FLOAT.findall(source.read_text()))
    return found


def _text_of(outputs) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
        elif out.get("output_type") == "error":
            parts.append(out.get("evalue", ""))
    return "\n".join(parts)


def _sanitizer():
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns((REPO / "notebooks" / "sanitize.cfg").read_text())

    def sanitize(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text
    return sanitize


# --- Measuring: strict nbval under each capability ----------------------------------------------

def run_capability(name: str, paths: list[Path], record: str, log) -> subprocess.Popen:
    env = dict(os.environ, KERNEL_CELLS_RECORD=record)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tools"), env.get("PYTHONPATH")]))
    env.pop("ATEN_CPU_CAPABILITY", None)
    if CAPABILITIES[name]:
        env["ATEN_CPU_CAPABILITY"] = CAPABILITIES[name]
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                             "-p", "kernel_cells", *map(str, paths)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)


def measure(paths: list[Path], jobs: int, keep: str | None = None) -> dict[str, dict]:
    """capability -> {"capability": what torch reported, "cells": {(notebook, cell): record}};
    with `keep`, each run's record and log stay in that folder."""
    seen: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ddp-lab-kernel-cells-") as tmp:
        tmp = keep or tmp
        os.makedirs(tmp, exist_ok=True)
        todo, running = list(CAPABILITIES), {}
        while todo or running:
            while todo and len(running) < jobs:
                name = todo.pop(0)
                log = open(os.path.join(tmp, f"{name}.log"), "w+")
                record = os.path.join(tmp, f"{name}.json")
                running[name] = (run_capability(name, paths, record, log), log, record, time.time())
                print(f"  {name}: strict nbval on {len(paths)} notebook(s) ...", flush=True)
            for name, (proc, log, record, start) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                log.seek(0)
                tail = log.read().strip().splitlines()[-1:] or ["(no output)"]
                log.close()
                print(f"  {name}: {tail[0]} ({time.time() - start:.0f} s)", flush=True)
                with open(record) as f:
                    data = json.load(f)
                data["cells"] = {(c["notebook"], c["cell"]): c for c in data["cells"]}
                seen[name] = data
            time.sleep(1)
    return seen


def differing(seen: dict[str, dict], notebook: str, count: int) -> tuple[list[int], list[int]]:
    """(cells whose outputs differ between capabilities, cells that failed natively)."""
    differ, unsteady = [], []
    for i in range(count):
        runs = [seen[name]["cells"].get((notebook, i)) for name in CAPABILITIES]
        outputs = [json.dumps(r["outputs"], sort_keys=True) if r else None for r in runs]
        if len(set(outputs)) > 1:
            differ.append(i)
        native = seen["native"]["cells"].get((notebook, i))
        if native is None or not native["passed"]:
            unsteady.append(i)
    return differ, unsteady


def entry(path: Path, seen: dict[str, dict]) -> dict:
    count = len(code_cells(path))
    differ, unsteady = differing(seen, path.name, count)
    floats = float_cells(path)
    # a cell that failed natively was not measured (its outputs are an error's): listed, to be
    # measured again once it passes
    return {"hash": content_hash(path), "code_cells": count,
            "cells": sorted(set(differ) | set(floats) | set(unsteady)),
            "differ": differ, "float_cells": floats, "failed_natively": unsteady}


def write(listed: dict, seen: dict[str, dict], paths: list[Path]) -> None:
    import platform

    import torch

    for path in paths:
        listed["notebooks"][path.name] = entry(path, seen)
    listed["notebooks"] = {k: listed["notebooks"][k] for k in sorted(listed["notebooks"])
                           if (REPO / "notebooks" / k).exists()}
    listed["measured"] = {
        "command": COMMAND, "torch": torch.__version__, "cpu": _cpu() or platform.processor(),
        "capabilities": {name: seen[name]["capability"] for name in CAPABILITIES}}
    LIST.write_text(json.dumps(listed, indent=1) + "\n")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK.ipynb")
    parser.add_argument("--all", action="store_true", help="every notebook")
    parser.add_argument("--check", action="store_true", help="name the stale entries; exit 1 if any")
    parser.add_argument("--jobs", type=int, default=3, help="capabilities measured at once (default 3)")
    parser.add_argument("--keep", metavar="DIR", help="keep each run's record and log in DIR")
    args = parser.parse_args(argv)
    listed = read_list()
    if args.check:
        for name, why in sorted(stale(listed).items()):
            print(f"{name}: {why}")
        return 1 if stale(listed) else 0
    paths = ([p.resolve() for p in args.notebooks] or
             (notebooks() if args.all else [REPO / "notebooks" / n for n in sorted(stale(listed))
                                            if (REPO / "notebooks" / n).exists()]))
    if not paths:
        if stale(listed):  # only entries of notebooks that are gone
            write(listed, {n: {"capability": listed.get("measured", {}).get("capabilities", {}).get(n)}
                           for n in CAPABILITIES}, [])
        print(f"{LIST.relative_to(REPO)}: every entry current")
        return 0
    print(f"measuring {len(paths)} notebook(s) under {', '.join(CAPABILITIES)}", flush=True)
    seen = measure(paths, max(1, args.jobs), args.keep)
    write(listed, seen, paths)
    failed = []
    for path in paths:
        e = listed["notebooks"][path.name]
        print(f"{path.name}: {len(e['cells'])} of {e['code_cells']} cells "
              f"(outputs differ: {e['differ']}; print floats: {e['float_cells']})"
              + (f"; FAILED natively: {e['failed_natively']}" if e["failed_natively"] else ""))
        failed += [path.name] if e["failed_natively"] else []
    if failed:
        print(f"cells failed under strict nbval with this CPU's own kernels in {', '.join(failed)}: "
              "they are listed, unmeasured; make them pass, then measure those notebooks again")
    return 1 if failed else 0


# --- The plugin each measuring run loads --------------------------------------------------------

_cells: list[dict] = []


def pytest_runtest_makereport(item, call):
    if call.when != "call" or not hasattr(item, "cell_num"):
        return
    from upgrade_record import _compared  # nbval's view of outputs, shared with the upgrade check

    _cells.append({"notebook": os.path.basename(str(item.fspath)), "cell": item.cell_num,
                   "passed": call.excinfo is None,
                   "outputs": _compared(item, item.test_outputs or [])})


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("KERNEL_CELLS_RECORD")
    if path:
        import torch

        with open(path, "w") as f:
            json.dump({"capability": torch.backends.cpu.get_cpu_capability(), "cells": _cells}, f)


if __name__ == "__main__":
    sys.exit(main())
