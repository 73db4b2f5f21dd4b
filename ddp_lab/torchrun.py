"""Running under torchrun: the process group set-up is torchrun's, so `launch` runs the function
here, on this rank, instead of starting processes. The result holds this rank only."""
from __future__ import annotations

import time
import traceback
from datetime import timedelta

from .rankinfo import rank_info
from .results import ErrorInfo, RankResult, RunResult


def run_here(fn, args, kwargs, *, backend, timeout, init_process_group, label="") -> RunResult:
    import torch
    import torch.distributed as dist

    info = rank_info()
    start = time.time()
    res = RankResult(rank=info.rank, status="ok")
    try:
        if init_process_group and not dist.is_initialized():
            if backend == "nccl":
                torch.cuda.set_device(info.local_rank)
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        res.value = fn(*args, **kwargs)
    except Exception as exc:  # reported as this rank's error, as a launched rank would be
        res.status, res.failed_at = "error", time.time()
        res.error = ErrorInfo(type(exc).__name__, str(exc), traceback.format_exc())
    finally:
        if init_process_group and dist.is_initialized():
            dist.destroy_process_group()
    res.seconds = time.time() - start
    return RunResult([res], backend=backend, timeout=timeout, seconds=res.seconds, label=label,
                     extra={"torchrun": True, "world_size": info.world_size})
