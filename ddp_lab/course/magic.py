"""`%%ddp`: the cell's code is the per-rank program (what a torchrun script would hold), run on
real ranks through `launch`. Names the cell uses from the notebook (classes, functions,
constants, imported modules) travel with it by value.

    %load_ext ddp_lab
    %%ddp -n 2 --timeout 30 --env TORCH_DISTRIBUTED_DEBUG=INFO -o result
    ...

Unless `-q`, the cell shows what the ranks printed and each rank's value (its last expression),
then the per-rank table.
"""
from __future__ import annotations

import argparse
import ast
import shlex
import types

from ..launching.frames import runner
from ..launching.launcher import launch
from ..launching.sanitize import sanitize


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%ddp", add_help=False)
    p.add_argument("-n", "--world-size", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--backend", default="auto")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--no-init", action="store_true", help="the cell initialises the group itself")
    p.add_argument("-o", "--out", default=None, help="store the RunResult in this variable")
    p.add_argument("-q", "--quiet", action="store_true", help="do not display the result")
    return p


def parse_line(line: str) -> argparse.Namespace:
    try:
        args = _parser().parse_args(shlex.split(line))
    except SystemExit:
        raise ValueError(f"bad %%ddp options: {line!r}; usage: {_parser().format_usage().strip()}") from None
    for item in args.env:
        if "=" not in item:
            raise ValueError(f"--env needs K=V, got {item!r}")
    return args


def used_names(source: str) -> set[str]:
    """Every name the cell reads."""
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}


def cell_namespace(source: str, user_ns: dict) -> tuple[dict, dict]:
    """(values, modules) of the notebook names the cell uses: modules travel by name."""
    values, modules = {}, {}
    for name in sorted(used_names(source)):
        if name not in user_ns or name.startswith("_"):
            continue
        obj = user_ns[name]
        if isinstance(obj, types.ModuleType):
            modules[name] = obj.__name__
        else:
            _require_picklable(name, obj)
            values[name] = obj
    return values, modules


def _require_picklable(name: str, obj) -> None:
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
    except Exception as exc:
        raise TypeError(f"the cell uses {name!r} ({type(obj).__name__}), which cannot be sent to the "
                        f"ranks ({exc}); build it inside the cell instead") from exc


CELL_NAME = "<%%ddp cell>"


@runner  # its frame is the launcher's: a traceback starts at the cell's own lines
def run_cell(source: str, values: dict, modules: dict):
    """Runs on each rank: execute the cell; the value of a final expression is the rank's value."""
    import importlib

    import linecache

    # Tracebacks and stacks through the cell then show its lines, as for a file.
    linecache.cache[CELL_NAME] = (len(source), None, source.splitlines(True), CELL_NAME)
    ns = {"__name__": "__main__", **values}
    ns.update({k: importlib.import_module(m) for k, m in modules.items()})
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, CELL_NAME, "exec"), ns)
    if last is not None:
        return eval(compile(ast.Expression(last.value), CELL_NAME, "eval"), ns)
    return None


def ddp_cell(line: str, cell: str, user_ns: dict):
    args = parse_line(line)
    values, modules = cell_namespace(cell, user_ns)
    env = dict(item.split("=", 1) for item in args.env)
    result = launch(run_cell, cell, values, modules, world_size=args.world_size, backend=args.backend,
                    timeout=args.timeout, env=env, init_process_group=not args.no_init, label="%%ddp")
    if args.out:
        user_ns[args.out] = result
    user_ns["_ddp"] = result
    if args.quiet:
        return None
    print_ranks(result)
    return result


VALUE_WIDTH = 200  # characters of a rank's value shown before "…"


def print_ranks(result) -> None:
    """Print, from the notebook's process, what the ranks printed (`[rank N] ...`) and each rank's
    value (the cell's last expression), so they show open above the per-rank table rather than
    only inside its closed folds."""
    result.print_output()
    if all(r.value is None for r in result.ranks):
        return
    for r in result.ranks:
        if r.ok:
            text = sanitize(repr(r.value))
            text = text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 1] + "…"
            print(f"rank {r.rank} returned {text}")


def register(ipython) -> None:
    def ddp(line, cell):
        return ddp_cell(line, cell, ipython.user_ns)

    ipython.register_magic_function(ddp, magic_kind="cell", magic_name="ddp")
