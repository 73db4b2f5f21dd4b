"""`launch`: run a function on real ranks, one fresh OS process each, and bring back every rank.

The launcher is the only place that starts, watches, times out and reaps processes. It hosts
the rendezvous store itself (as torchrun's agent does), so ports are never guessed, and a rank
that dies cannot take the store with it.
"""
from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import _procs, flight, pyspy
from .rankinfo import in_torchrun
from .results import ErrorInfo, RankResult, RunResult

BACKENDS = ("auto", "gloo", "nccl")
START_METHODS = ("auto", "forkserver", "spawn")
# Variables that torch or its C++ libraries read only when torch is imported: a launch that sets
# one of them starts its ranks by plain spawn, so they take effect.
IMPORT_TIME_VARS = ("TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GLOG_v", "GLOG_minloglevel")
STACK_WAIT = 1.0  # seconds to let a rank write its stacks before it is killed
DEFAULT_TIMEOUT = 60.0
PG_TIMEOUT_MARGIN = 10.0  # the process group's own timeout outlasts the launch's


@dataclass
class _Rank:
    rank: int
    paths: dict[str, str]
    handle: Any = None
    exitcode: int | None = None
    ended_at: float | None = None
    stopped: str = ""  # why the launcher stopped it, if it did
    native: bool = False  # ask py-spy for its native stack before stopping it
    native_stack: str = ""


def launch(fn: Callable, *args, world_size: int = 2, backend: str = "auto",
           timeout: float | None = None,
           env: dict[str, str] | None = None, init_process_group: bool = True,
           start_method: str = "auto", grace: float = 5.0, label: str = "",
           native_stacks: bool = False, **kwargs) -> RunResult:
    """Run `fn(*args, **kwargs)` once per rank, each rank a fresh process, and return a
    `RunResult` with every rank's status, value or error, output and (if it hung) stack.

    `timeout` (default 60 s) bounds the ranks' run, counted once every rank has started (a cold fork server
    first imports torch); ranks still running then have their stacks captured and are killed. After a rank fails, the others get `grace` seconds to finish or fail on
    their own before they are stopped the same way.
    """
    # A timeout the caller chose turns on PyTorch's flight recorder (it costs a warm launch a
    # few per cent; see README): each rank's collectives then come back in `collectives`.
    record = timeout is not None
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    _check_args(fn, world_size, timeout, env, start_method, grace)
    if native_stacks:
        pyspy.require()  # says so, before anything starts, when py-spy is not installed
    if in_torchrun():
        from .torchrun import run_here

        return run_here(fn, args, kwargs, backend=resolve_backend(backend, None),
                        timeout=timeout, init_process_group=init_process_group, label=label)
    backend = resolve_backend(backend, world_size)
    payload = _pickle_payload(fn, args, kwargs)
    env = {str(k): str(v) for k, v in (env or {}).items()}
    if start_method == "auto":
        spawn = not _procs.forkserver_available() or any(k in env for k in IMPORT_TIME_VARS)
        start_method = "spawn" if spawn else "forkserver"
    workdir = tempfile.mkdtemp(prefix="ddp-lab-")
    ranks: list[_Rank] = []
    start = time.time()
    try:
        store = _rendezvous_store(timeout)
        base_env = dict(os.environ, **env, **_rendezvous_env(world_size, store.port))
        if record:
            base_env.setdefault(flight.ENV, flight.BUFFER)  # unless the caller set it (0: off)
        for r in range(world_size):
            ranks.append(_start_rank(r, workdir, payload, base_env, backend, timeout,
                                     init_process_group, start_method, world_size))
            ranks[-1].native = native_stacks
        _watch(ranks, time.time() + timeout, grace)  # counted from when every rank is started
        return _collect(ranks, backend, timeout, time.time() - start, label, start)
    finally:
        for rk in ranks:
            if rk.handle is not None:
                rk.handle.kill()
                rk.handle.forget()
        shutil.rmtree(workdir, ignore_errors=True)


def resolve_backend(backend: str, world_size: int | None) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "gloo":
        return backend
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    needed = world_size or 1
    if backend == "nccl" and gpus < needed:
        raise RuntimeError(f"backend 'nccl' needs one GPU per rank: {needed} rank(s) asked for, "
                           f"{gpus} GPU(s) visible. Use backend='gloo' (CPU) or fewer ranks.")
    if backend == "auto":
        return "nccl" if gpus >= needed and torch.distributed.is_nccl_available() else "gloo"
    return backend


def _check_args(fn, world_size, timeout, env, start_method, grace) -> None:
    if not callable(fn):
        raise TypeError(f"launch needs a function to run on each rank, got {type(fn).__name__}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if env is not None and not isinstance(env, dict):
        raise TypeError(f"env must be a dict of environment variables, got {type(env).__name__}")
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}: use one of {', '.join(START_METHODS)}")
    if grace < 0:
        raise ValueError(f"grace must be >= 0 seconds, got {grace!r}")


def _pickle_payload(fn, args, kwargs) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        culprit = _unpicklable(fn, args, kwargs)
        raise TypeError(f"cannot send {culprit} to the ranks: it cannot be pickled ({exc}). "
                        "Pass plain data, or build the object inside the function.") from exc


def _unpicklable(fn, args, kwargs) -> str:
    import cloudpickle

    named = [(f"the function {getattr(fn, '__name__', fn)!r}", fn)]
    named += [(f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in kwargs.items()]
    for name, obj in named:
        try:
            cloudpickle.dumps(obj)
        except Exception:
            return name
    return "the function and its arguments"


def _rendezvous_store(timeout: float):
    from torch.distributed import TCPStore
    from datetime import timedelta

    # Port 0: the kernel picks a free port for the store, so launches never collide.
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=timeout + PG_TIMEOUT_MARGIN))


def _rendezvous_env(world_size: int, port: int) -> dict[str, str]:
    return {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GROUP_RANK": "0",
            "TORCHELASTIC_USE_AGENT_STORE": "True", "DDP_LAB_RANK_PROCESS": "1"}


def _start_rank(r, workdir, payload, base_env, backend, timeout, init_pg, start_method, world_size):
    paths = {k: os.path.join(workdir, f"rank{r}.{k}") for k in ("stdout", "stderr", "stack", "result")}
    flight.prepare(paths, workdir, r)
    env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r))
    spec = dict(paths, payload=payload, env=env, sys_path=list(sys.path), backend=backend,
                init_process_group=init_pg, pg_timeout=timeout + PG_TIMEOUT_MARGIN,
                threads=max(1, (os.cpu_count() or 1) // world_size))
    spec_path = os.path.join(workdir, f"rank{r}.spec")
    with open(spec_path, "wb") as f:
        pickle.dump(spec, f)
    rk = _Rank(r, paths)
    if start_method == "forkserver":
        # The server may be busy preloading one module (seconds; more on a loaded machine).
        rk.handle = _procs.fork_server().spawn(spec_path, timeout=max(180.0, timeout))
    else:
        rk.handle = _procs.SpawnedRank(spec_path, dict(env, PYTHONPATH=os.pathsep.join(sys.path)))
    return rk


def _watch(ranks: list[_Rank], deadline: float, grace: float) -> None:
    """Wait for every rank to exit; stop the rest at the deadline, or `grace` s after a failure."""
    first_failure = None
    while True:
        now = time.time()
        for rk in ranks:
            if rk.exitcode is None and (code := rk.handle.exitcode()) is not None:
                rk.exitcode, rk.ended_at = code, now
                if code != 0 and first_failure is None:
                    first_failure = rk
        running = [rk for rk in ranks if rk.exitcode is None]
        if not running:
            return
        if now >= deadline:
            return _stop(running, "timeout")
        if first_failure is not None and now >= first_failure.ended_at + grace:
            return _stop(running, f"stopped by the launcher {grace:g} s after rank "
                                  f"{first_failure.rank} failed")
        running[0].handle.wait_change(min(0.01, max(0.0, deadline - now)))


def _stop(running: list[_Rank], why: str) -> None:
    import signal as _signal

    asked = [rk for rk in running if flight.request(rk.paths)]  # each dumps its flight record
    until = time.time() + STACK_WAIT
    while time.time() < until and not all(os.path.exists(rk.paths["flight"]) for rk in asked):
        time.sleep(0.01)
    for rk in running:
        try:
            os.kill(rk.handle.pid, _signal.SIGUSR1)  # faulthandler dumps every thread's stack
        except OSError:
            pass
    until = time.time() + STACK_WAIT
    sizes = {}
    while time.time() < until:
        now_sizes = {rk.rank: _size(rk.paths["stack"]) for rk in running}
        if all(now_sizes.values()) and now_sizes == sizes:
            break
        sizes = now_sizes
        time.sleep(0.05)
    for rk in running:
        if rk.native:
            rk.native_stack = pyspy.dump(rk.handle.pid)
        rk.handle.kill()
        rk.stopped = why
    until = time.time() + 5
    for rk in running:
        while rk.handle.exitcode() is None and time.time() < until:
            rk.handle.wait_change(0.01)
        rk.exitcode, rk.ended_at = rk.handle.exitcode(), time.time()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _collect(ranks, backend, timeout, seconds, label, start) -> RunResult:
    return RunResult([_rank_result(rk, start) for rk in ranks], backend=backend, timeout=timeout,
                     seconds=seconds, label=label)


def _rank_result(rk: _Rank, start: float) -> RankResult:
    import cloudpickle

    res = RankResult(rank=rk.rank, status="ok", stdout=_read(rk.paths["stdout"]),
                     stderr=_read(rk.paths["stderr"]), stack=_read(rk.paths["stack"]),
                     exitcode=rk.exitcode, seconds=(rk.ended_at or time.time()) - start,
                     note=rk.stopped, collectives=flight.read(rk.paths),
                     native_stack=rk.native_stack)
    record = None
    if os.path.exists(rk.paths["result"]):
        with open(rk.paths["result"], "rb") as f:
            record = pickle.load(f)
    if record and "type" in record:
        res.status = "error"
        res.error = ErrorInfo(record["type"], record["message"], record["traceback"])
        res.failed_at = record["failed_at"]
    elif record and rk.exitcode == 0:
        try:
            res.value = cloudpickle.loads(record["value"])
        except Exception as exc:
            res.status, res.failed_at = "error", rk.ended_at
            res.error = ErrorInfo(type(exc).__name__, f"the rank's return value could not be "
                                  f"unpickled in the launcher: {exc}")
    elif rk.stopped:
        res.status, res.failed_at = "timeout", rk.ended_at
    else:
        res.status, res.failed_at = "crashed", rk.ended_at
    if rk.stopped and not res.stack:
        res.stack = "(the rank wrote no stack before it was killed)"
    return res
