"""One way in for rank information: RANK / LOCAL_RANK / WORLD_SIZE are read here and nowhere else.

Code that runs on a rank calls `rank_info()` once and passes `rank` on explicitly. `device()`
is the one place that chooses where a rank's tensors live: `cuda:LOCAL_RANK` when the process
group runs on NCCL with a GPU for this rank, else the CPU.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass

# What a launcher gives its ranks (the course's, torchrun's). A shell on a node has none of them,
# so a launcher started from inside a rank (lessons 17 and 20 run torchrun's agent there) runs
# without them: with TORCHELASTIC_USE_AGENT_STORE=True and MASTER_PORT set, a TCPStore asked to
# serve on MASTER_PORT quietly becomes a client of the store already there (TCPStore.cpp,
# pytorch#147465).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


@contextlib.contextmanager
def environ(values: dict, drop=()):
    """Set `values` and remove `drop` (e.g. RANK_VARIABLES) in this process's environment; put
    everything back afterwards."""
    saved = {k: os.environ.get(k) for k in (*values, *drop)}
    for k in drop:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, prints and writes checkpoints."""
        return self.rank == 0


def rank_info() -> RankInfo:
    env = os.environ
    return RankInfo(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", env.get("RANK", 0))),
                    int(env.get("WORLD_SIZE", 1)))


# The course's launcher names a folder of its own for each launch, which it removes when the launch
# ends, whichever way its ranks end (a rank killed at the timeout runs no cleanup of its own).
SCRATCH = "DDP_LAB_SCRATCH"


def scratch_dir() -> str:
    """Where a rank makes its temporary files and folders (`tempfile.mkdtemp(dir=scratch_dir())`):
    the launch's own folder, private to this user and removed by the launcher when the launch
    ends, so a hung rank that is killed leaves nothing behind; outside the course's launcher
    (torchrun's ranks, a plain process), the system's temporary folder."""
    return os.environ.get(SCRATCH) or tempfile.gettempdir()


def in_torchrun() -> bool:
    """True inside a process that torchrun (or another launcher) started as a rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def device():
    """`cuda:LOCAL_RANK` when this rank has a GPU and the group is NCCL; otherwise the CPU."""
    import torch
    import torch.distributed as dist

    nccl = dist.is_initialized() and dist.get_backend() == "nccl"
    if nccl or (not dist.is_initialized() and torch.cuda.is_available()):
        local = rank_info().local_rank
        if torch.cuda.is_available() and local < torch.cuda.device_count():
            return torch.device("cuda", local)
    return torch.device("cpu")


def ddp_kwargs(dev) -> dict:
    """`device_ids` for DDP only when the module is on a GPU; a CPU module must not get any."""
    return {"device_ids": [dev.index]} if dev.type == "cuda" else {}


def restart_clock(seconds: float | None = None) -> bool:
    """In a rank started by `ddp_lab.launch`: count this rank's timeout from now, after a long
    set-up (e.g. `deepspeed.initialize`), so the set-up's seconds on a loaded machine neither
    eat a deliberate hang's seconds nor force a long launch timeout; with `seconds`, the rank
    has that many seconds from now instead of the launch's timeout. False (nothing done) when
    this process is not a launched rank (e.g. under torchrun)."""
    from . import child

    return child.restart_clock(seconds)
