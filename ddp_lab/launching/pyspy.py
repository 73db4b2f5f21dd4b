"""Optional: each hung rank's native stack (C++ frames included) from py-spy.

faulthandler shows a hung rank's Python frames; the frames below them, inside gloo or NCCL (a
wait on a socket, a lock, the GIL), only a native profiler sees. `launch(..., native_stacks=True)`
asks py-spy (`pip install py-spy`, a binary wheel; ddp_lab does not depend on it) for each rank
it stops, before killing it. Without py-spy it says so and starts nothing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

MISSING = ("native_stacks=True needs py-spy, which is not installed (it is optional): "
           "`pip install py-spy` in this environment, then run again")


def find() -> str | None:
    """The py-spy executable: on PATH, or beside this Python's (a virtual environment's bin/)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def require() -> str:
    exe = find()
    if exe is None:
        raise RuntimeError(MISSING)
    return exe


def dump(pid: int, timeout: float = 10.0) -> str:
    """py-spy's `dump --native` of a live process, or a line saying why there is none."""
    exe = find()
    if exe is None:
        return f"({MISSING})"
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid), "--native"], capture_output=True,
                             text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(py-spy could not read the rank: {exc})"
    if out.returncode != 0 or not out.stdout.strip():
        why = next((ln for ln in out.stderr.splitlines() if ln.strip()), f"status {out.returncode}")
        return f"(py-spy could not read the rank: {why})"
    return out.stdout
