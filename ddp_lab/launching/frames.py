"""Which stack frames, files and module names are ddp_lab's own: the one place that knows.

Stacks and tracebacks come back from the ranks as text (faulthandler's dumps, formatted
tracebacks). The launcher leaves its own frames out of what a learner reads, and the doctor
tells the user's code from its own; both ask here. A place of ours is derived from a module's
`__file__` (`place(module)`), and a module passed by name to another process (the rank's entry
under plain spawn, the fork server's program, what the server preloads) from this module's
`__name__`, so moving a file cannot silently break a filter: no path or module name of
ddp_lab is written as a string anywhere else (tests/test_paths_of_ours.py checks it).

The launcher's engine cannot be imported from here (its rank entry imports this module), so
its three modules are named once, below, and checked to exist when this module is imported.
"""
from __future__ import annotations

import os
import re
import sysconfig

PACKAGE = __name__.split(".")[0]  # "ddp_lab"
_LAUNCHING = __name__.rpartition(".")[0]  # this package
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))  # the folder that holds the package

# Frame lines of tracebacks (`File "x.py", line 3, in f`) and of faulthandler's dumps
# (`File "x.py", line 3 in f`): the file, the line, the function.
FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')
# The same, a whole line: its indent, file, line, the comma (traceback) or not, function.
FRAME_LINE = re.compile(r'^(\s*)File "([^"]+)", line (\d+)(,?) in (\S+)')

RANK_ENTRY = "child_main"  # the function a rank process starts in (child.py)
STARTS = ("<frozen runpy>", "<string>")  # `python -m`, `python -c` (spawned ranks, the server)


def place(where) -> str:
    """Where a module or folder of ours lives, from the folder that holds the package, with
    '/': a module (or its `__file__`) -> "ddp_lab/launching/child.py"; a package or a folder
    -> "ddp_lab/doctor/"."""
    path = os.path.abspath(getattr(where, "__file__", None) or where)
    if os.path.basename(path) == "__init__.py":
        path = os.path.dirname(path)
    relative = os.path.relpath(path, _ROOT).replace(os.sep, "/")
    return relative + "/" if os.path.isdir(path) else relative


HOME = place(os.path.dirname(_HERE))  # "ddp_lab/": every file of the package


def in_places(filename: str, places) -> bool:
    """Whether `filename` (as a frame shows it: absolute, or cut by `sanitize`) is in one of
    `places` (from `place`): a module by its path's end, a folder anywhere in the path."""
    name = "/" + filename.replace("\\", "/")
    return any(("/" + p) in name if p.endswith("/") else name.endswith("/" + p) for p in places)


def _engine(leaf: str) -> tuple[str, str]:
    """(module name, place) of the engine module `leaf` of this package, which must exist."""
    path = os.path.join(_HERE, leaf + ".py")
    if not os.path.isfile(path):
        raise ImportError(f"{__name__} names {_LAUNCHING}.{leaf}, which is gone: name the "
                          "module that took its place")
    return f"{_LAUNCHING}.{leaf}", place(path)


CHILD, _CHILD = _engine("child")  # what a rank process runs (a spawned one: processes._SPAWN)
_FORKSERVER_MODULE, _FORKSERVER = _engine("forkserver")
_, _PROCESSES = _engine("processes")
FORKSERVER = f"from {_FORKSERVER_MODULE} import main; main()"  # the fork server's `-c` program
ENGINE = (_CHILD, _FORKSERVER, _PROCESSES)  # the modules whose frames are the launcher's
_runners: set[tuple[str, str]] = set()


def runner(fn):
    """Decorator: `fn` runs the user's code on a rank on the launcher's behalf (the `%%ddp`
    magic's `run_cell`), so its frame is the launcher's, not the user's."""
    _runners.add((place(fn.__code__.co_filename), fn.__name__))
    return fn


def launchers(filename: str, function: str = "") -> bool:
    """A frame of the launcher's own (how a rank starts, the engine, a registered runner), not
    of the function the user launched."""
    if filename in STARTS or in_places(filename, ENGINE):
        return True
    return any(name == function and in_places(filename, (where,)) for where, name in _runners)


def main_thread_frames(stack: str) -> list[tuple[str, str]]:
    """(filename, function) of the main thread's frames, innermost first, from a faulthandler
    dump: the block that holds the module's top or the rank's entry."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack)
    main = [b for b in blocks if "<module>" in b or RANK_ENTRY in b]
    block = main[0] if main else (blocks[0] if blocks else "")
    return [(f, fn) for f, _, fn in FRAME.findall(block)]


_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                 for k in ("stdlib", "platstdlib")})


def without_passing_threads(stack: str) -> str:
    """A faulthandler dump without the threads that only run Python's own library (a weakref
    callback, a queue feeder between two items): they come and go by timing, so a stopped
    rank's dump would read differently from run to run. The main thread always stays, and every
    thread with a frame of torch, of ours or of the user's."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack)
    main = next((b for b in blocks if "<module>" in b or RANK_ENTRY in b), blocks[0])

    def passing(block: str) -> bool:
        files = [f for f, _, _ in FRAME.findall(block)]
        return bool(files) and all(f.startswith(_STDLIB) or f.startswith("<frozen")
                                   for f in files)

    return "\n".join(b for b in blocks if b is main or not passing(b))
