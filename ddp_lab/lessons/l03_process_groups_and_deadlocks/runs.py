"""The per-rank code of lesson 03. Every function here runs on a rank (through `ddp_lab.launch`);
none starts a process."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import Timeline, record_collectives
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from ...instruments.logs import get_logger


# Timelines that survive a hang: each span is written to the rank's log as it starts and ends,
# so the spans of a rank the launcher had to kill are read back from its record (figures.py).
LOGGER = "l03.timeline"


@dataclass
class LoggedTimeline(Timeline):
    """A `probes.Timeline` that also logs `span start NAME T` and `span end NAME T0 T1`
    (seconds since `align`) at DEBUG level: into the rank's record, not onto the console."""

    log: Any = None

    def align(self) -> None:
        super().align()
        self.log.debug("timeline t0 %.6f", time.time())

    @contextmanager
    def span(self, name: str):
        start = time.perf_counter() - self.t0
        self.log.debug("span start %s %.6f", name, start)
        try:
            yield
        finally:
            end = time.perf_counter() - self.t0
            self.spans.append((name, start, end))
            self.log.debug("span end %s %.6f %.6f", name, start, end)


# -- 1. initialisation ----------------------------------------------------------------------

def init_group(config_world_size: int | None = None, config_rank: int | None = None,
               timeout_s: float | None = 3.0) -> dict:
    """Initialise the process group as a training script does, with the rank and world size its
    configuration gives (None: what the launcher put in the environment), then all-reduce a 1
    from every rank to prove that every rank is in."""
    info = rank_info()
    rank = info.rank if config_rank is None else config_rank
    world_size = info.world_size if config_world_size is None else config_world_size
    timeout = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    dist.init_process_group(rank=rank, world_size=world_size, **timeout)
    try:
        ones = torch.ones(1)
        dist.all_reduce(ones)
        return {"world_size": dist.get_world_size(), "sum": ones.item()}
    finally:
        dist.destroy_process_group()


# -- 2. a collective that only rank 0 calls ---------------------------------------------------

class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x)


def report_on_rank0(loss: torch.Tensor, step: int) -> None:
    """The classic: average the loss over ranks where it is printed, on rank 0 only."""
    if rank_info().is_main:
        dist.all_reduce(loss)
        print(f"step {step}: mean loss {loss.item() / dist.get_world_size():.4f}")


def report_on_every_rank(loss: torch.Tensor, step: int) -> None:
    """Every rank takes part in the all_reduce; only rank 0 prints."""
    dist.all_reduce(loss)
    if rank_info().is_main:
        print(f"step {step}: mean loss {loss.item() / dist.get_world_size():.4f}")


def train_and_report(report=report_on_rank0, steps: int = 3, barrier: bool = False) -> dict:
    """A few DDP steps of TinyNet; after each, `report(loss, step)`, then a `dist.barrier()` if
    `barrier` (the source document's cure). Each phase and each collective is a span of a
    timeline that is also written to the rank's log, so a rank killed mid-span still has one."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(TinyNet().to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(info.rank + 1)
    timeline = LoggedTimeline(log=get_logger(LOGGER))
    timeline.align()
    with record_collectives(timeline):
        for step in range(steps):
            x = torch.randn(16, 8, device=dev)
            with timeline.span("forward"):
                loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
            with timeline.span("backward"):
                opt.zero_grad()
                loss.backward()
            with timeline.span("optimizer step"):
                opt.step()
            report(loss.detach().clone(), step)
            if barrier:
                dist.barrier()
    return {"spans": timeline.spans}


# -- 3. collectives that do not match -----------------------------------------------------------

def per_rank(values, rank: int):
    """`values[rank]`; ranks past the end of `values` take its last entry."""
    return values[min(rank, len(values) - 1)]


def shard_losses(rank: int, shard_sizes) -> torch.Tensor:
    """Per-sample validation losses of `rank`'s shard (seeded: the same on every call)."""
    return torch.rand(per_rank(shard_sizes, rank), generator=torch.Generator().manual_seed(rank))


def evaluate(shard_sizes=(4, 3), summary: bool = False) -> dict:
    """The mean validation loss over every rank's shard. Without `summary`, every rank
    all-reduces its per-sample losses, whose length is its shard's; with it, every rank
    all-reduces (sum, count), two numbers whatever its shard holds."""
    info = rank_info()
    losses = shard_losses(info.rank, shard_sizes).to(device())
    if summary:
        total = torch.stack([losses.sum(), torch.tensor(float(len(losses)), device=losses.device)])
        dist.all_reduce(total)
        mean = (total[0] / total[1]).item()
    else:
        dist.all_reduce(losses)  # "sum the losses of every rank"
        mean = (losses.sum() / sum(per_rank(shard_sizes, r) for r in range(info.world_size))).item()
    truth = torch.cat([shard_losses(r, shard_sizes) for r in range(info.world_size)]).mean().item()
    return {"mean": mean, "error": abs(mean - truth)}


# -- 4. a barrier that names the missing rank ---------------------------------------------------

def uneven_epoch(batches=(2, 3), barrier: str = "monitored", wait_s: float = 3.0) -> dict:
    """An epoch of `batches[rank]` steps, each all-reducing a gradient, then the end-of-epoch
    barrier: `dist.barrier()` ("plain") or `dist.monitored_barrier` ("monitored"), which
    gloo runs (a gloo group is made for it when the default group is NCCL)."""
    info, dev = rank_info(), device()
    # made by every rank before anything can diverge: new_group is itself collective
    gloo = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    for _ in range(per_rank(batches, info.rank)):
        grad = torch.full((4,), float(info.rank + 1), device=dev)
        dist.all_reduce(grad)
    if barrier == "monitored":
        dist.monitored_barrier(group=gloo, timeout=timedelta(seconds=wait_s))
    else:
        dist.barrier()
    return {"steps": per_rank(batches, info.rank)}
