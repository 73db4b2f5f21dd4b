"""Running under torchrun: the process group set-up is torchrun's, so `launch` runs the function
here, on this rank, instead of starting processes. The result holds this rank only.

A torchrun rank that ends through Python's own shutdown can abort ("terminate called without an
active exception", SIGABRT) or hang: a gloo worker thread that still has to take the GIL (to free
a tensor of its last collective) is killed by the interpreter's finalization mid-C++ code, and a
process group freed by the garbage collector at exit joins a worker thread waiting for the GIL
the collector holds (torch 2.13, gloo). So `ddp-lab` ends its torchrun ranks as the launcher
ends its own: it lets the worker threads finish, flushes its output, and exits with `os._exit`.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta

from . import child
from .costs import from_records
from .rankinfo import rank_info
from .results import ERROR, OK, ErrorInfo, RankResult, RunResult


QUIESCE = 0.05  # seconds: the GIL released, so gloo's worker threads can drop finished work


def end_rank(code: int) -> None:
    """End this torchrun rank with exit status `code`, without the interpreter's teardown (see
    the module docstring): worker threads get the GIL to finish, output is flushed, then
    `os._exit`. Never returns."""
    time.sleep(QUIESCE)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run_here(fn, args, kwargs, *, backend, timeout, init_process_group, label="") -> RunResult:
    import torch
    import torch.distributed as dist

    info = rank_info()
    start = time.time()
    res = RankResult(rank=info.rank, status=OK)
    child.forget_steps()  # a torchrun rank may run several functions: report this one's steps
    try:
        if init_process_group and not dist.is_initialized():
            if backend == "nccl":
                torch.cuda.set_device(info.local_rank)
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        res.value = fn(*args, **kwargs)
    except Exception as exc:  # reported as this rank's error, as a launched rank would be
        res.status, res.failed_at = ERROR, time.time()
        res.error = ErrorInfo(type(exc).__name__, str(exc), traceback.format_exc())
    finally:
        if init_process_group and dist.is_initialized():
            time.sleep(QUIESCE)  # gloo's worker threads release finished work first (they need the GIL)
            dist.destroy_process_group()
    res.seconds = time.time() - start
    cost = child.costs()  # the peak is the process's, since it started
    res.peak_rss_mb, res.steps = cost["peak_rss_mb"], from_records(cost["steps"])
    return RunResult([res], backend=backend, timeout=timeout, seconds=res.seconds, label=label)

