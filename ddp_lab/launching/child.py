"""The rank side of a launch: what runs inside each rank process.

A rank reads its spec (a pickle written by the launcher), makes itself the leader of a new
process group (so the launcher can kill it and anything it starts), sends its stdout/stderr to
files at the file-descriptor level, arms faulthandler so the launcher can ask for every
thread's stack, initialises the process group if asked, runs the function, and writes a result
file. Nothing here starts a process; the launcher owns processes.

Run as `python -m <this module> SPEC` for a plain-spawn launch (see frames.CHILD); the forkserver calls
`child_main(spec_path)` in a freshly forked child.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback
from collections import deque
from datetime import timedelta

from . import flight, torchrun_world
from .frames import launchers

STACK_SIGNAL = signal.SIGUSR1
_KEEP_ALIVE: list = []
STEPS_KEPT = 10_000  # step records kept per rank (the newest), as the flight recorder keeps its
_steps: deque = deque(maxlen=STEPS_KEPT)
_peak_seen_mb = 0.0  # the highest peak a step saw before it reset the kernel's high-water mark


def die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (a rank, and
    anything a rank starts that must not outlive it: lesson 06's torchrun workers)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _redirect(spec: dict) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, spec["stdout"]), (2, spec["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, fd)
        os.close(out)
    kw = dict(buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stdout = open(1, "w", **kw)
    sys.stderr = open(2, "w", **kw)


def _arm_stack_dump(spec: dict) -> None:
    stack_file = open(spec["stack"], "w")
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    spec["_stack_file"] = stack_file  # keep it open for the life of the rank


def _init_group(spec: dict) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    backend = spec["backend"]
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=timedelta(seconds=spec["pg_timeout"]))


def _teardown() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            # Give gloo's worker threads the GIL to release finished work first: a group
            # destroyed while they wait for the GIL deadlocks in ~ProcessGroupGloo (torch 2.13).
            time.sleep(0.02)
            dist.destroy_process_group()
    except Exception:
        pass


def _from_user(tb):
    """The traceback from the user's code on, the launcher's frames (and its runners') left out."""
    while tb is not None and launchers(tb.tb_frame.f_code.co_filename, tb.tb_frame.f_code.co_name):
        tb = tb.tb_next
    return tb


def _error_record(exc: BaseException) -> dict:
    tb = _from_user(exc.__traceback__)
    return {
        "kind": "error",
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)),
        "failed_at": time.time(),
    }


def _write_result(path: str, record: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(pickle.dumps(record))
    os.replace(tmp, path)


def _preload(names) -> None:
    """Import what a rank forked from a warm server already has (a cold or spawned rank pays
    for it here, before its clock starts, not inside a 3 s deliberate hang)."""
    import importlib

    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:
                pass  # the user's code that needs it raises the real import error itself


_ready_path: str | None = None


def _mark_ready(path: str, seconds: float | None = None) -> None:
    """Tell the launcher this rank is ready: its timeout counts from now. Written anew (a new
    file, renamed into place), it restarts the clock: see `restart_clock`."""
    global _ready_path
    _ready_path = path
    tmp = f"{path}.{time.monotonic_ns()}"
    with open(tmp, "w") as f:
        f.write(repr(time.time()) + ("" if seconds is None else f" {float(seconds)!r}"))
    os.replace(tmp, path)


def restart_clock(seconds: float | None = None) -> bool:
    """Count this rank's timeout from now (`seconds` from now when given); False when this
    process is not a launched rank."""
    if _ready_path is None:
        return False
    _mark_ready(_ready_path, seconds)
    return True


def record_step(step: dict, peak_before_mb: float = 0.0) -> None:
    """Keep one step's record (`ddp_lab.measured_step`) for the result; `peak_before_mb`
    is the process's peak just before the step reset it."""
    global _peak_seen_mb
    _peak_seen_mb = max(_peak_seen_mb, peak_before_mb, step.get("peak_mb", 0.0))
    _steps.append(step)


def forget_steps() -> None:
    """Start a new list of steps (a torchrun rank runs one function after another)."""
    _steps.clear()


def costs() -> dict:
    """What this process cost: its peak resident memory in MiB (getrusage, and any peak a step
    reset) and its step records."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    peak_mb = peak / 2 ** 20 if sys.platform == "darwin" else peak / 1024
    return {"peak_rss_mb": max(peak_mb, _peak_seen_mb), "steps": list(_steps) or None}


def _run(spec: dict) -> dict:
    import cloudpickle

    if "OMP_NUM_THREADS" not in os.environ and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(spec["threads"])  # as torchrun: no oversubscription
    fn, args, kwargs = cloudpickle.loads(spec["payload"])
    _preload(spec.get("preload", ()))
    if spec["init_process_group"]:
        _init_group(spec)
    _mark_ready(spec["ready"])
    value = fn(*args, **kwargs)
    try:
        blob = cloudpickle.dumps(value)
    except Exception as exc:
        raise TypeError(
            f"the function returned a {type(value).__name__} that cannot be pickled "
            f"back to the launcher ({exc}); return plain data instead"
        ) from exc
    return {"kind": "value", "value": blob}


def child_main(spec_path: str) -> None:
    """Entry point of a rank process. Never returns: exits with 0 on success, 1 on error."""
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (plain spawn with start_new_session)
    die_with_parent()
    _redirect(spec)
    os.environ.clear()
    os.environ.update(spec["env"])
    sys.path[:] = spec["sys_path"]
    if spec.get("as_torchrun"):  # a fresh `python -u` worker's seeds, streams and SIGINT
        os.chdir(spec["cwd"])  # the caller's, as a new process inherits it (not the server's)
        torchrun_world.become_fresh()
    if "torch.distributed" in sys.modules:  # preloaded: re-read what torch read at import
        sys.modules["torch.distributed"].set_debug_level_from_env()
    if "tempfile" in sys.modules:  # a preload may have asked it already: ask again (TMPDIR)
        sys.modules["tempfile"].tempdir = None
    _arm_stack_dump(spec)
    flight.arm(spec)  # a hung rank still dumps its flight record when the launcher asks
    start = time.time()
    code = 0
    try:
        record = _run(spec)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, even SystemExit
        record, code = _error_record(exc), 1
        if spec.get("as_torchrun"):  # as Python prints it (sys.excepthook; nothing for sys.exit)
            torchrun_world.print_uncaught(exc, _from_user(exc.__traceback__))
        else:
            sys.stderr.write(record["traceback"])  # as Python would print it, from the user's frame
        # Keep the exception (and through its traceback, the failed function's locals) alive
        # until os._exit: freeing a process group there, with the GIL held, can deadlock in
        # ~ProcessGroupGloo while its worker thread waits for the GIL (seen on torch 2.13).
        _KEEP_ALIVE.append(exc)
    if spec.get("as_torchrun"):  # the script's threads and atexit functions, as Python ends
        torchrun_world.exit_as_python()
    flight.dump_at_exit(spec)
    _teardown()
    record.update(costs())
    record["seconds"] = time.time() - start
    _write_result(spec["result"], record)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

