"""Scenario 5: a resume that is not one. Three launches share a folder: the straight run (every
step in one go), the first half (then a checkpoint), and the restart that resumes from it. What
the checkpoint holds is the learner's choice (`model_only` or `everything`); `restore` puts back
whatever it holds. Every function here runs on a rank."""
from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DistributedSampler

from ...instruments.probes import gather
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .runs import refuse_under_torchrun

SEED, SAMPLES, BATCH, FEATURES = 0, 64, 8, 8  # 64 samples, 2 ranks, batches of 8: 4 steps an epoch
STEPS = 20  # the straight run; the restart comes after STEPS // 2 (step 10: mid-epoch)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


@dataclass
class Job:
    """Everything a training step reads or changes."""
    model: DDP
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    sampler: DistributedSampler
    step: int = 0
    epoch: int = 0
    position: int = 0  # batches of the current epoch already trained on


def start() -> Job:
    """What the script does when it starts (or restarts): seed, build, wrap."""
    rank = rank_info().rank
    random.seed(SEED + rank)                # augmentation: its own draws on every rank
    np.random.seed(SEED + rank)
    torch.manual_seed(SEED)                 # the same initial weights on every rank
    model = DDP(Net().to(device()), **ddp_kwargs(device()))
    torch.manual_seed(SEED + 1 + rank)      # dropout: its own masks on every rank
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    sampler = DistributedSampler(range(SAMPLES), shuffle=True, seed=SEED)
    return Job(model, opt, sched, sampler)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    return x, (x * torch.linspace(-1, 1, FEATURES)).sum(1, keepdim=True)


def augment(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Python's and numpy's generators, as augmentation code uses them: a random scale, noise."""
    scale = random.uniform(0.5, 1.5)
    noise = torch.from_numpy(np.random.normal(0, 0.05, x.shape).astype(np.float32))
    return x * scale + noise, y * scale


def next_batch(job: Job) -> list[int]:
    """The next batch of this rank's shard: the sampler's order for `job.epoch`, from
    `job.position` on."""
    job.sampler.set_epoch(job.epoch)
    order = list(BatchSampler(job.sampler, BATCH, drop_last=True))
    if job.position == len(order):
        job.epoch, job.position = job.epoch + 1, 0
        return next_batch(job)
    job.position += 1
    return order[job.position - 1]


def train(job: Job, steps: int) -> list[float]:
    """`steps` steps; the mean loss over ranks at each."""
    x, y = data()
    losses = []
    for _ in range(steps):
        idx = next_batch(job)
        xb, yb = augment(x[idx], y[idx])
        loss = F.mse_loss(job.model(xb.to(device())), yb.to(device()))
        job.opt.zero_grad()
        loss.backward()
        job.opt.step()
        job.sched.step()
        job.step += 1
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses


# -- what a checkpoint holds, and how it is put back -------------------------------------------

def model_only(job: Job) -> dict:
    """What most scripts save: the weights."""
    return {"model": job.model.module.state_dict()}


def rng_state() -> dict:
    """This rank's three generators (torch, numpy, Python). Each rank's differ: a checkpoint
    keeps every rank's, `gather(rng_state())`, a list indexed by rank."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def everything(job: Job) -> dict:
    """Everything the next step depends on: weights, optimizer and scheduler state, where the
    sampler is (epoch and position), the step, and every random generator of every rank."""
    return {"model": job.model.module.state_dict(), "optimizer": job.opt.state_dict(),
            "scheduler": job.sched.state_dict(), "step": job.step, "epoch": job.epoch,
            "position": job.position, "rng": gather(rng_state())}  # a list: one entry per rank


def restore(job: Job, ckpt: dict) -> None:
    """Put back whatever `ckpt` holds; its "rng" is a list, one entry per rank."""
    job.model.module.load_state_dict(ckpt["model"])
    if "optimizer" in ckpt:
        job.opt.load_state_dict(ckpt["optimizer"])
    if "scheduler" in ckpt:
        job.sched.load_state_dict(ckpt["scheduler"])
    job.step, job.epoch, job.position = (ckpt.get(k, 0) for k in ("step", "epoch", "position"))
    if "rng" in ckpt:
        mine = this_ranks(ckpt["rng"])  # entry r of a list with one entry per rank
        torch.set_rng_state(mine["torch"])
        np.random.set_state(mine["numpy"])
        random.setstate(mine["python"])


def this_ranks(rng) -> dict:
    """This rank's entry of a checkpoint's "rng"; said plainly when it is not one per rank."""
    info = rank_info()
    if isinstance(rng, (list, tuple)) and len(rng) == info.world_size:
        return rng[info.rank]
    got = ("a dict, one rank's generators (rng_state())" if isinstance(rng, dict)
           else f"a {type(rng).__name__}" + (f" of {len(rng)}" if isinstance(rng, (list, tuple)) else ""))
    raise TypeError(f'the checkpoint\'s "rng" is {got}; restore expects a list, one entry per rank '
                    f"({info.world_size}), rank r taking entry r: save gather(rng_state())")


def fingerprint(module: nn.Module) -> str:
    h = hashlib.blake2b(digest_size=8)
    for t in module.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# -- the three launches -------------------------------------------------------------------------

def straight(workdir: str, **_) -> dict:
    """Launch 1: every step in one go; rank 0 keeps the losses for the comparison."""
    refuse_under_torchrun("partial_resume", "its restart is a new launch, new processes, and "
                          "under torchrun the processes are torchrun's")
    job = start()
    losses = train(job, STEPS)
    if rank_info().is_main:
        torch.save({"losses": losses, "weights": fingerprint(job.model.module)},
                   os.path.join(workdir, "straight.pt"))
    return {"losses": losses}


def first_half(workdir: str, state_of=model_only, **_) -> dict:
    """Launch 2: the first half, then a checkpoint of `state_of(job)` (rank 0 writes it)."""
    job = start()
    losses = train(job, STEPS // 2)
    state = state_of(job)
    if rank_info().is_main:
        torch.save(state, os.path.join(workdir, "checkpoint.pt"))
    dist.barrier()
    return {"losses": losses, "saved": sorted(state)}


def resumed(workdir: str, state_of=model_only, **_) -> dict:
    """Launch 3, the restart: start as the script does, restore the checkpoint, train the second
    half, and compare with the straight run step by step."""
    job = start()
    # our own file: weights_only=False lets numpy's random state through
    restore(job, torch.load(os.path.join(workdir, "checkpoint.pt"), weights_only=False))
    losses = train(job, STEPS - STEPS // 2)
    ref = torch.load(os.path.join(workdir, "straight.pt"))
    tail = ref["losses"][STEPS // 2:]
    return {"losses": losses, "straight": ref["losses"],
            "departure": max(abs(a - b) for a, b in zip(losses, tail)),
            "identical": losses == tail and fingerprint(job.model.module) == ref["weights"]}
