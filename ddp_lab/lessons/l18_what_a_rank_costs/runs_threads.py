"""The per-rank code of lesson 18's threads scenario. Each rank trains with the number of
threads it was launched with (every core, when nothing caps it) or with its fair share of the
cores (cores // ranks on the machine), then measures, in the same run, a step at every core
against a step at the fair share, in alternating blocks, every rank switching together: the
ratio of the two, never an absolute time. Every function here runs on a rank."""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import measured_step
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import Net

ROWS_PER_CORE = 512  # a batch of 512 x cores rows: enough work per operator for every core


def cores() -> int:
    """The logical CPUs this process may run on (its CPU affinity; all of the machine's
    elsewhere): hardware threads, two per physical core where 2-way SMT is on, whereas torch's
    default thread count is one per physical core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def fair_share() -> int:
    """Threads per rank that use every core once: cores // ranks on this machine (at least 1)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", rank_info().world_size))
    return max(1, cores() // local)


def train_threads(threads: str = "as_launched", steps: int = 2, rounds: int = 7,
                  block: int = 2) -> dict:
    """`threads="as_launched"` keeps the threads the launch gave each rank (the bug when every
    rank sees every core); "fair_share" sets them first, as a training script should.
    Trains `steps` steps, then times `rounds` x `block` steps at every core and at the fair
    share, alternately, and returns their ratio."""
    if threads == "fair_share":
        torch.set_num_threads(fair_share())
    elif threads != "as_launched":
        raise ValueError(f"threads must be 'as_launched' or 'fair_share', got {threads!r}")
    used = torch.get_num_threads()
    dev = device()
    torch.manual_seed(0)
    model = DDP(Net().to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(ROWS_PER_CORE * cores(), 64, device=dev)

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), x[:, :1]).backward()
        opt.step()

    for _ in range(steps):
        with measured_step():
            step()
    per_step = compare_threads(step, (fair_share(), cores()), rounds, block)
    torch.set_num_threads(used)
    return {"threads": used, "fair_share": fair_share(), "cores": cores(),
            "over_share": used / fair_share(), "seconds_per_step": per_step,
            "slowdown": per_step[cores()] / per_step[fair_share()]}


def compare_threads(step, counts, rounds: int, block: int) -> dict:
    """Seconds per step at each thread count in `counts`: the median over `rounds` blocks of
    `block` steps, timed in alternation after one untimed warm-up block each; every rank switches
    together (a barrier). The median, not the mean: one step that the scheduler happens to spare
    (the other rank waiting in a collective) or to stall says nothing of the rest."""
    spent = {k: [] for k in counts}
    for r in range(rounds + 1):
        for k in counts:
            torch.set_num_threads(k)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(block):
                step()
            if r:
                spent[k].append((time.perf_counter() - start) / block)
    return {k: statistics.median(s) for k, s in spent.items()}
