"""A script run as `python train.py args` runs it (torchrun's workers run `python -u train.py
args`, torch/distributed/run.py): `sys.argv` is the path as the user gave it and the arguments;
`sys.path[0]` is the script's folder, in place of the entry of the program that runs it (a
`python -m` program's working directory: a module there is not importable under torchrun
either); `__main__` is a fresh module whose `__file__` is the absolute path (Python >= 3.9),
with no `__spec__` and a SourceFileLoader; an uncaught `sys.exit("message")` prints its message.

Not `runpy.run_path`: it sets `sys.argv[0]` to the path it runs (runpy._ModifiedArgv0), so a
script saw an absolute path where torchrun gives the one typed.
"""
from __future__ import annotations

import builtins
import io
import os
import sys
import types
from importlib.machinery import SourceFileLoader

from ...launching.frames import runner


@runner  # the launcher's frame: a traceback starts at the script's own
def run_as_main(path: str, args, argv0: str | None = None, replace_first: bool = True) -> int:
    """Run the script at `path`; its exit status (0 when it returned; an exception other than
    SystemExit propagates). `replace_first`: the script's folder takes the place of
    `sys.path[0]` (a rank's), else it is put before it (a caller that keeps its own). Called
    on a rank only: `__main__` stays the script's."""
    path = os.path.abspath(path)
    sys.argv = [path if argv0 is None else str(argv0), *map(str, args)]
    folder = os.path.dirname(path)
    if replace_first and sys.path:
        sys.path[0] = folder
    elif not sys.path or sys.path[0] != folder:
        sys.path.insert(0, folder)
    with io.open_code(path) as f:
        source = f.read()
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                         __loader__=SourceFileLoader("__main__", path), __spec__=None,
                         __package__=None)
    sys.modules["__main__"] = main  # and stays: what the script pickled names __main__
    try:
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)  # as Python prints sys.exit("message")
        return 1
    return 0
