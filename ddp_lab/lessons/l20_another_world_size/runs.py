"""What runs on each rank in lesson 20's scenarios 1 and 5 (the same job at world size 1, 2 and 4;
accumulation chosen from the world size), and the single process every run is measured against.

One data set for the whole lesson: linear regression, 256 samples of 8 features, SGD at lr 0.05,
one epoch, a global batch of 16 in one process. Every rank builds it from the same seed."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ...launching.rankinfo import ddp_kwargs, device, rank_info

SAMPLES, FEATURES = 256, 8
GLOBAL_BATCH, LR, SEED = 16, 0.05, 0


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): y = x @ w + noise, the same on every rank."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    return x, x @ w + 0.5 * torch.randn(SAMPLES, 1, generator=g)


def new_model() -> nn.Linear:
    torch.manual_seed(SEED)
    return nn.Linear(FEATURES, 1)


def epoch_loss(model: nn.Module) -> float:
    """The mean squared error over all 256 samples."""
    dev = next(model.parameters()).device
    x, y = (t.to(dev) for t in dataset())
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


def my_indices(world: int, rank: int) -> list[int]:
    """This rank's samples for epoch 0, in order: DistributedSampler's shard of its shuffle."""
    sampler = DistributedSampler(range(SAMPLES), num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    sampler.set_epoch(0)
    return list(sampler)


def train_epoch(model: nn.Module, indices: list[int], batch: int, lr: float, accum: int = 1,
                group=None) -> list[float]:
    """One epoch of SGD over `indices` in micro-batches of `batch`, an optimizer step every `accum`
    of them; with `group`, DDP over that group (no all-reduce while accumulating: `no_sync`).
    Returns the epoch loss (all 256 samples) after each optimizer step. On this rank's device
    (a GPU under NCCL, else the CPU)."""
    dev = device()
    model.to(dev)
    net = DDP(model, process_group=group, **ddp_kwargs(dev)) if group is not None else model
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x, y = (t.to(dev) for t in dataset())
    micro = [indices[i:i + batch] for i in range(0, len(indices), batch)]
    curve = []
    for start in range(0, len(micro), accum):
        chunk = micro[start:start + accum]
        for i, idx in enumerate(chunk):
            last = i == len(chunk) - 1
            with net.no_sync() if (group is not None and not last) else _nothing():
                (nn.functional.mse_loss(net(x[idx]), y[idx]) / len(chunk)).backward()
        opt.step()
        opt.zero_grad()
        curve.append(epoch_loss(model))
    return curve


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def single_process(batch: int = GLOBAL_BATCH, lr: float = LR) -> list[float]:
    """The job on one process, the reference: the epoch loss after each step."""
    return train_epoch(new_model(), my_indices(1, 0), batch, lr)


def at_world(world: int, per_rank_batch: int, lr: float, group, accum: int = 1) -> list[float]:
    """The job on the first `world` ranks of this launch (over `group`), DDP; [] on the others."""
    rank = rank_info().rank
    if rank >= world:
        return []
    return train_epoch(new_model(), my_indices(world, rank), per_rank_batch, lr, accum, group)


def same_job_at(per_rank_batch: int | None = None, scale_lr: bool = False) -> dict:
    """Run at world size 4: the job at world 1 (rank 0 alone), 2 (ranks 0 and 1, a group of
    their own) and 4 (every rank). `per_rank_batch` fixed, as a script's `--batch-size` is; None:
    GLOBAL_BATCH // world, the global batch kept. `scale_lr`: lr x world (the linear rule)."""
    world = dist.get_world_size()
    pair = dist.new_group([0, 1])  # every rank creates it; only ranks 0 and 1 train in it
    curves, batches = {}, {}
    for w, group in ((1, None), (2, pair), (world, dist.group.WORLD)):
        b = per_rank_batch or GLOBAL_BATCH // w
        lr = LR * w if scale_lr else LR
        curves[w] = at_world(w, b, lr, group)
        batches[w] = b * w
    reference = single_process()
    final = {w: c[-1] for w, c in curves.items() if c}
    return {"curves": {str(w): c for w, c in curves.items()}, "reference": reference,
            "global_batch": {str(w): b for w, b in batches.items()},
            "final": {str(w): v for w, v in final.items()},
            "gap": max(abs(v - reference[-1]) for v in final.values())}


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """The fix: as many micro-batches per rank as keep `global_batch` samples per step."""
    steps, rest = divmod(global_batch, micro_batch * world_size)
    if rest or not steps:
        raise ValueError(f"a global batch of {global_batch} is not {micro_batch} x {world_size} ranks x k")
    return steps


def tuned_on_one_process(global_batch: int, micro_batch: int, world_size: int) -> int:
    """The bug: the accumulation steps a one-process run needed, whatever the world size."""
    return global_batch // micro_batch


def accumulate(steps_for=tuned_on_one_process, micro_batch: int = 4) -> dict:
    """Micro-batches of 4 (what fits in memory), `steps_for(16, 4, world)` of them per optimizer
    step on each rank. Returns the global batch it trained with and the epoch-loss curve beside
    the single process's."""
    world = dist.get_world_size()
    accum = steps_for(GLOBAL_BATCH, micro_batch, world)
    curve = at_world(world, micro_batch, LR, dist.group.WORLD, accum=accum)
    reference = single_process()
    return {"accum": accum, "global_batch": micro_batch * accum * world, "curve": curve,
            "reference": reference, "gap": abs(curve[-1] - reference[-1])}
