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
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import flight, processes, pyspy, torchrun_world
from .costs import from_records
from .rankinfo import SCRATCH, in_torchrun
from .tail import Tail
from .results import (CRASHED, ERROR, INTERRUPTED, OK, TIMEOUT, ErrorInfo, LaunchInterrupted,
                      RankResult, RunResult)

BACKENDS = ("auto", "gloo", "nccl")
START_METHODS = ("auto", "forkserver", "spawn")
# Variables that torch or its C++ libraries read only when torch is imported: a launch that sets
# one of them starts its ranks by plain spawn, so they take effect.
IMPORT_TIME_VARS = ("TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GLOG_v", "GLOG_minloglevel")
STACK_WAIT = 1.0  # seconds to let a rank write its stacks before it is killed
DEFAULT_TIMEOUT = 60.0
PG_TIMEOUT_MARGIN = 10.0  # the process group's own timeout outlasts the launch's
# A rank's clock starts when it is ready (imports and process-group set-up done). Until then it
# is bounded by this start-up limit, generous for a loaded machine and a cold fork server.
STARTUP_LIMIT = 120.0


@dataclass
class _Rank:
    rank: int
    paths: dict[str, str]
    handle: Any = None
    started_at: float = 0.0
    ready_at: float | None = None  # when the rank said it was about to call the function
    ready_mark: tuple | None = None  # the ready file's identity; a new one restarts the clock
    budget: float | None = None  # seconds the rank gave itself with restart_clock(seconds)
    exitcode: int | None = None
    ended_at: float | None = None
    stopped: str = ""  # why the launcher stopped it, if it did
    native: bool = False  # ask py-spy for its native stack before stopping it
    native_stack: str = ""

    def deadline(self, timeout: float) -> float:
        if self.ready_at is None:
            return self.started_at + STARTUP_LIMIT
        return self.ready_at + (timeout if self.budget is None else self.budget)


@dataclass(frozen=True)
class _LaunchSpec:
    """What every rank of one launch shares."""

    workdir: str
    payload: bytes
    base_env: dict
    backend: str
    timeout: float
    init_process_group: bool
    start_method: str
    world_size: int
    as_torchrun: bool = False
    run_id: str = ""


def launch(fn: Callable, *args, world_size: int = 2, backend: str = "auto",
           timeout: float | None = None,
           env: dict[str, str] | None = None, init_process_group: bool = True,
           start_method: str = "auto", grace: float = 5.0, label: str = "",
           native_stacks: bool = False, as_torchrun: bool = False, output=None,
           **kwargs) -> RunResult:
    """Run `fn(*args, **kwargs)` once per rank, each rank a fresh process, and return a
    `RunResult` with every rank's status, value or error, output and (if it hung) stack.

    `timeout` (default 60 s) bounds each rank's run,
    counted from the moment that rank is ready (its imports and process-group set-up done, just
    before it calls `fn`), so neither a cold fork server nor a loaded machine eats into it; a rank that never gets ready is stopped `STARTUP_LIMIT` s
    after it started. Once every running rank's time is up, their stacks are captured and they
    are killed. After a rank fails, the others get `grace` seconds to finish or fail on their
    own before they are stopped the same way. Each rank's flight record (the collectives torch
    records by default; `env={"TORCH_FR_BUFFER_SIZE": "0"}` turns it off) comes back in
    `RankResult.collectives`.

    `as_torchrun`: each rank gets what torchrun gives a worker and nothing of the launcher's
    (torchrun_world.py: its variables, fresh seeds, `python -u` streams, SIGINT, an uncaught
    exception printed as Python prints it); ranks still fork from the fork server. `output`:
    `output(rank, stream, line)` is called for each line a rank writes, as it writes it (tail.py).

    Keyword arguments named like an option of `launch` (`timeout`, `env`, `label`, ...) are
    taken by `launch`; bind such an argument first: `launch(functools.partial(fn, timeout=3))`.
    """
    # torch records every collective by default (TORCH_FR_BUFFER_SIZE, 2000 entries; 0: off):
    # each rank dumps its record for every launch, into `collectives` (flight.py; docs/launching.md).
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    _validate_args(fn, world_size, timeout, env, start_method, grace)
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
        spawn = not processes.forkserver_available() or any(k in env for k in IMPORT_TIME_VARS)
        start_method = "spawn" if spawn else "forkserver"
    workdir = tempfile.mkdtemp(prefix="ddp-lab-")
    ranks: list[_Rank] = []
    start = time.time()
    run_id = str(uuid.uuid4()) if as_torchrun else ""  # torchrun: one id per job
    tail = None
    try:
        for attempt in (1, 2):
            store = _rendezvous_store(timeout)
            folder = os.path.join(workdir, str(attempt))
            spec = _LaunchSpec(folder, payload, _base_env(env, world_size, store.port, folder),
                               backend, timeout, init_process_group, start_method, world_size,
                               as_torchrun, run_id)
            os.mkdir(spec.workdir)
            os.mkdir(os.path.join(folder, "scratch"))  # rankinfo.scratch_dir(): removed below
            try:
                for r in range(world_size):
                    ranks.append(_start_rank(r, spec))
                    ranks[-1].native = native_stacks
                break
            except processes.ServerDied:
                if attempt == 2:
                    raise
                _kill(ranks)  # the server died (killed, OOM) under us: start over on a new one
                ranks = []
        if start_method == "forkserver":
            _preload_for_next_time(fn)
        if output is not None:
            tail = Tail({(rk.rank, s): rk.paths[s] for rk in ranks for s in ("stdout", "stderr")},
                        output)
        try:
            _watch(ranks, timeout, grace, tail)
        except KeyboardInterrupt:  # Ctrl-C, Jupyter's stop button: keep what the ranks did
            _stop([rk for rk in ranks if rk.exitcode is None], INTERRUPTED)
            result = _collect(ranks, backend, timeout, time.time() - start, label, start)
            raise LaunchInterrupted(result) from None
        if tail is not None:
            tail.close()
        return _collect(ranks, backend, timeout, time.time() - start, label, start)
    finally:
        _kill(ranks)
        shutil.rmtree(workdir, ignore_errors=True)


def _kill(ranks: list[_Rank]) -> None:
    for rk in ranks:
        if rk.handle is not None:
            rk.handle.kill()
            rk.handle.forget()


def _preload_for_next_time(fn) -> None:
    """Ask the fork server to import the module that defines `fn` (each rank imports it, as
    cloudpickle sends the function by reference), so the next launch of it starts warm."""
    name = getattr(fn, "__module__", None)
    if name in (None, "__main__") or not getattr(sys.modules.get(name), "__file__", None):
        return
    try:
        processes.prewarm(modules=[name])
    except processes.ServerDied:
        pass  # the next launch starts a new server


def resolve_backend(backend: str, world_size: int | None) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "gloo":
        return backend
    import torch

    from .cuda_init import gpu_count

    gpus = gpu_count()  # never initialises CUDA in the caller (a notebook may fork later)
    needed = world_size or 1
    if backend == "nccl" and gpus < needed:
        raise RuntimeError(f"backend 'nccl' needs one GPU per rank: {needed} rank(s) asked for, "
                           f"{gpus} GPU(s) visible. Use backend='gloo' (CPU) or fewer ranks.")
    if backend == "auto":
        return "nccl" if gpus >= needed and torch.distributed.is_nccl_available() else "gloo"
    return backend


def _validate_args(fn, world_size, timeout, env, start_method, grace) -> None:
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


def _base_env(env: dict, world_size: int, port: int, folder: str) -> dict:
    return dict(os.environ, **env, **_rendezvous_env(world_size, port),
                **{SCRATCH: os.path.join(folder, "scratch")})


def _rendezvous_env(world_size: int, port: int) -> dict[str, str]:
    return {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GROUP_RANK": "0",
            "TORCHELASTIC_USE_AGENT_STORE": "True", "DDP_LAB_RANK_PROCESS": "1"}


def _start_rank(r: int, launch: _LaunchSpec) -> _Rank:
    paths = {k: os.path.join(launch.workdir, f"rank{r}.{k}")
             for k in ("stdout", "stderr", "stack", "result", "ready")}
    flight.prepare(paths, launch.workdir, r)
    env = dict(launch.base_env, RANK=str(r), LOCAL_RANK=str(r))
    if launch.as_torchrun:  # torchrun's worker: its variables, none of the launcher's own
        os.mkdir(os.path.join(launch.workdir, f"rank{r}"))
        # the scratch folder is the course's ranks' own: a script gets the system's, as under torchrun
        base = {k: v for k, v in launch.base_env.items() if k != SCRATCH}
        env = torchrun_world.worker_env(base, r, launch.world_size, launch.run_id,
                                        os.path.join(launch.workdir, f"rank{r}", "error.json"))
    spec = dict(paths, payload=launch.payload, env=env, sys_path=list(sys.path),
                backend=launch.backend, init_process_group=launch.init_process_group,
                pg_timeout=launch.timeout + PG_TIMEOUT_MARGIN, preload=processes.PRELOAD_IDLE,
                threads=max(1, (os.cpu_count() or 1) // launch.world_size),
                as_torchrun=launch.as_torchrun, cwd=os.getcwd())
    spec_path = os.path.join(launch.workdir, f"rank{r}.spec")
    with open(spec_path, "wb") as f:
        pickle.dump(spec, f)
    rk = _Rank(r, paths, started_at=time.time())
    if launch.start_method == "forkserver":
        # The server may be busy preloading one module (seconds; more on a loaded machine).
        rk.handle = processes.fork_server().spawn(spec_path, timeout=STARTUP_LIMIT)
    else:
        rk.handle = processes.SpawnedRank(spec_path, dict(env, PYTHONPATH=os.pathsep.join(sys.path)))
    return rk


def _watch(ranks: list[_Rank], timeout: float, grace: float, tail: Tail | None = None) -> None:
    """Wait for every rank to exit. Stop the running ones once each has used its `timeout`
    (from when it was ready), or `grace` s after a rank failed. `tail`: the ranks' output
    passed on as it comes."""
    first_failure = None
    while True:
        now = time.time()
        if tail is not None:
            tail.poll()
        for rk in ranks:
            mark = _ready_mark(rk.paths["ready"])
            if mark is not None and mark != rk.ready_mark:  # ready, or rankinfo.restart_clock()
                rk.ready_at, rk.ready_mark, rk.budget = now, mark, _budget(rk.paths["ready"])
            if rk.exitcode is None and (code := rk.handle.exitcode()) is not None:
                rk.exitcode, rk.ended_at = code, now
                if code != 0 and first_failure is None:
                    first_failure = rk
        running = [rk for rk in ranks if rk.exitcode is None]
        if not running:
            return
        deadline = max(rk.deadline(timeout) for rk in running)
        if now >= deadline:
            late = [rk.rank for rk in running if rk.ready_at is None]
            return _stop(running, TIMEOUT if not late else
                         f"timeout: rank(s) {', '.join(map(str, late))} not ready "
                         f"{STARTUP_LIMIT:g} s after starting (imports, process-group set-up)")
        if first_failure is not None and now >= first_failure.ended_at + grace:
            return _stop(running, f"stopped by the launcher {grace:g} s after rank "
                                  f"{first_failure.rank} failed")
        running[0].handle.wait_change(min(0.01, max(0.0, deadline - now)))


def _ready_mark(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _budget(path: str) -> float | None:
    """The seconds a rank gave itself when it restarted its clock (None: the launch's)."""
    try:
        with open(path) as f:
            words = f.read().split()
        return float(words[1]) if len(words) > 1 else None
    except (OSError, ValueError):
        return None


def _stop(running: list[_Rank], why: str) -> None:
    import signal as _signal

    asked = [rk for rk in running if flight.request(rk.paths)]  # each dumps its flight record
    until = time.time() + STACK_WAIT
    while time.time() < until and not all(os.path.exists(rk.paths["flight"]) for rk in asked):
        time.sleep(0.01)
    for rk in asked:  # its dump thread gone: the stacks below show the rank's own threads
        flight.wait_thread_gone(rk.paths, rk.handle.pid, until)
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
    processes.freeze([rk.handle.pid for rk in running], time.time() + STACK_WAIT)
    for rk in running:  # none of them runs on to see another one die
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

    res = RankResult(rank=rk.rank, status=OK, stdout=_read(rk.paths["stdout"]),
                     stderr=_read(rk.paths["stderr"]), stack=_read(rk.paths["stack"]),
                     exitcode=rk.exitcode, seconds=(rk.ended_at or time.time()) - start,
                     note=rk.stopped, collectives=flight.read(rk.paths),
                     native_stack=rk.native_stack)
    record = None
    if os.path.exists(rk.paths["result"]):
        with open(rk.paths["result"], "rb") as f:
            record = pickle.load(f)
    if record:  # what the rank cost: its peak memory, the steps it marked (launching/costs.py)
        res.peak_rss_mb, res.steps = record.get("peak_rss_mb"), from_records(record.get("steps"))
    if record and record["kind"] == "error":
        res.status = ERROR
        res.error = ErrorInfo(record["type"], record["message"], record["traceback"])
        res.failed_at = record["failed_at"]
    elif record and rk.exitcode == 0:
        try:
            res.value = cloudpickle.loads(record["value"])
        except Exception as exc:
            res.status, res.failed_at = ERROR, rk.ended_at
            res.error = ErrorInfo(type(exc).__name__, f"the rank's return value could not be "
                                  f"unpickled in the launcher: {exc}")
    elif rk.stopped:
        res.status, res.failed_at = TIMEOUT, rk.ended_at
    else:
        res.status, res.failed_at = CRASHED, rk.ended_at
    if rk.stopped and not res.stack:
        res.stack = "(the rank wrote no stack before it was killed)"
    return res
