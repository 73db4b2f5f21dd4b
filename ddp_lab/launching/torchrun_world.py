"""A rank as torchrun starts a worker: `launch(..., as_torchrun=True)` (what `ddp-lab watch` runs a
user's script with). Two halves: the environment torchrun's agent gives each worker
(`worker_env`, in the launcher), and, in the rank, what a fresh `python -u train.py` has that a
rank forked from the fork server does not (`become_fresh`, `print_uncaught`, in child.py).

Read from torch 2.13's own source and measured under `torchrun --standalone --nproc-per-node 2`
(docs/watch.md, "What watch changes in a run"):

- the worker's variables: torch/distributed/elastic/agent/server/local_elastic_agent.py
  (`_start_workers`: RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE,
  GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
  TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE,
  TORCH_NCCL_ASYNC_ERROR_HANDLING, LOCAL_RANK); TORCHELASTIC_ERROR_FILE per worker
  (elastic/multiprocessing/api.py); TORCHELASTIC_SIGNALS_TO_HANDLE (launcher/api.py, set in the
  agent's environment, which the workers inherit); OMP_NUM_THREADS=1 when unset and more than
  one process per node (run.py); a one-node job's rendezvous is `localhost:0` (run.py), so
  MASTER_ADDR is "localhost";
- the worker runs `python -u script.py` (run.py): stdout and stderr unbuffered (write-through);
- a fresh interpreter: SIGINT raises KeyboardInterrupt; torch's default CPU generator, numpy's
  global RandomState and `random` seeded from the OS, each rank its own, each run its own.
  (CUDA's generators start at torch's constant `default_rng_seed_val`,
  c10/core/GeneratorImpl.h, in a fresh process too: they are left alone.)

What a fork cannot give is the string-hash seed (`hash("a")`, the order of a set of strings):
Python fixes it when an interpreter starts, so the ranks forked from one fork server share it.
"""
from __future__ import annotations

import os
import signal
import sys

ROLE = "default"  # torchrun's --role default: the "default" of its "[default0]:" prefixes
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's --signals-to-handle default
MASTER_ADDR = "localhost"
# the launcher's own marker (instruments/logs.py reads it): torchrun's workers have none
LAUNCHER_ONLY = ("DDP_LAB_RANK_PROCESS",)


def worker_env(base: dict, rank: int, world_size: int, run_id: str, error_file: str) -> dict:
    """The environment torchrun's agent gives worker `rank` of a one-node job of `world_size`
    workers, on top of `base` (the caller's environment with MASTER_PORT of the launch's store)."""
    env = {k: v for k, v in base.items() if k not in LAUNCHER_ONLY}
    if "OMP_NUM_THREADS" not in env and world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    env.update({
        "RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_NAME": ROLE,
        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
        "WORLD_SIZE": str(world_size), "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": base["MASTER_PORT"],
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TORCHELASTIC_ERROR_FILE": error_file, "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
    })
    return env


def become_fresh() -> None:
    """In a rank forked from the fork server, before any user code: what a fresh
    `python -u script.py` started by torchrun has (see the module's docstring)."""
    reseed()
    _unbuffered_streams()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        # torch read OMP_NUM_THREADS when the fork server imported it: apply the rank's own
        sys.modules["torch"].set_num_threads(int(threads))


def reseed() -> None:
    """Seed what a fresh interpreter seeds from the OS: torch's default CPU generator, numpy's
    global RandomState (when numpy.random is imported: the fork server's torch._dynamo imports
    it), and `random` (CPython already reseeds it in a forked child: random.py's
    register_at_fork)."""
    import random

    random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def _unbuffered_streams() -> None:
    """sys.stdout and sys.stderr as `python -u` makes them: write-through text over unbuffered
    files, on the same file descriptors (the launcher's redirections)."""
    import io

    for name, fd, errors in (("stdout", 1, "strict"), ("stderr", 2, "backslashreplace")):
        old = getattr(sys, name)
        try:
            old.flush()
        except (OSError, ValueError, AttributeError):
            pass
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding="utf-8", errors=errors,
                                            write_through=True))


def exit_as_python() -> None:
    """What Python does when a script has ended (returned or raised), before the interpreter
    tears itself down (the launcher's rank then ends with os._exit, child.py): wait for the
    script's non-daemon threads (an async checkpoint writer), then run its atexit functions."""
    import atexit
    import threading

    try:
        threading._shutdown()  # what Py_FinalizeEx calls first (Lib/threading.py)
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()  # prints a failing function's traceback itself, as Python does


def print_uncaught(exc: BaseException, tb) -> None:
    """What Python prints for an exception that ends a script: nothing for sys.exit(int) or
    sys.exit(None), the value of another sys.exit, else the traceback through sys.excepthook
    (init_process_group installs one that prefixes each line with "[rankN]: ")."""
    if isinstance(exc, SystemExit):
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return
    full = exc.__traceback__  # the hook prints the exception's own traceback: the trimmed one
    exc.__traceback__ = tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except Exception:  # noqa: BLE001 - a broken hook: Python's own printing
        sys.__excepthook__(type(exc), exc, tb)
    finally:
        exc.__traceback__ = full
