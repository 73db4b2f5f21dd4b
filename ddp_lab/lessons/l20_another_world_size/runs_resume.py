"""Lesson 20's scenario 4: a job checkpointed mid-epoch at one world size and resumed at another.

The first job trains `STEPS_BEFORE` steps of epoch 0 and rank 0 writes a checkpoint; every rank
writes the samples it trained on. The resumed job, at another world size, finds its place in the
epoch and trains the rest. Both keep the script's per-rank batch (4), as a script's
`--batch-size` does.

Why the place moves: DistributedSampler shuffles the whole data set with one generator seeded
`seed + epoch` (torch/utils/data/distributed.py:110-112), the same permutation at every world
size, then gives rank r every `num_replicas`-th index from r (distributed.py:134). So the first
`n` samples consumed are the permutation's first `n`, and skipping k batches per rank skips
k x batch x world of them: the same k at another world size skips another number."""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .runs import LR, SAMPLES, SEED, dataset, new_model

STEPS_BEFORE, BATCH = 6, 4


def _train(indices: list[int], model: nn.Module, opt, batch: int = BATCH) -> None:
    dev = device()
    x, y = (t.to(dev) for t in dataset())
    net = DDP(model, **ddp_kwargs(dev))
    for i in range(0, len(indices), batch):
        idx = indices[i:i + batch]
        opt.zero_grad()
        nn.functional.mse_loss(net(x[idx]), y[idx]).backward()
        opt.step()


def _write(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def first_job(workdir: str, steps: int = STEPS_BEFORE) -> dict:
    """`steps` steps of epoch 0, then a checkpoint: the model, the optimizer, the epoch, the step,
    and how many samples of the epoch the whole job has consumed."""
    info = rank_info()
    sampler = DistributedSampler(range(SAMPLES), shuffle=True, seed=SEED)  # this group's size and rank
    sampler.set_epoch(0)
    mine = list(sampler)[:steps * BATCH]
    model = new_model().to(device())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    _train(mine, model, opt)
    _write(os.path.join(workdir, f"seen-first-{info.rank}.json"), mine)
    if info.is_main:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 0,
                    "step": steps, "samples_seen": steps * BATCH * info.world_size},
                   os.path.join(workdir, "checkpoint.pt"))
    dist.barrier()
    return {"world_size": info.world_size, "trained_on": len(mine)}


def skip_steps(checkpoint: dict, world: int, rank: int) -> list[int]:
    """The bug: this rank's sampler for the epoch, less the first `step` batches."""
    sampler = DistributedSampler(range(SAMPLES), num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    sampler.set_epoch(checkpoint["epoch"])
    return list(sampler)[checkpoint["step"] * BATCH:]


def reshard_the_rest(checkpoint: dict, world: int, rank: int) -> list[int]:
    """The fix: the epoch's permutation (the sampler at one replica), less the samples the whole
    job consumed, sharded over the ranks there are now (a sampler over what is left, unshuffled)."""
    whole = DistributedSampler(range(SAMPLES), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    whole.set_epoch(checkpoint["epoch"])
    rest = list(whole)[checkpoint["samples_seen"]:]
    shard = DistributedSampler(rest, num_replicas=world, rank=rank, shuffle=False)
    return [rest[i] for i in shard]


def resumed_job(workdir: str, place=skip_steps) -> dict:
    """Load the checkpoint, find this rank's place in the epoch with `place`, train the rest.
    Rank 0 then counts, over both jobs, the samples seen twice and those never seen."""
    info = rank_info()
    checkpoint = torch.load(os.path.join(workdir, "checkpoint.pt"), map_location=device())
    mine = place(checkpoint, info.world_size, info.rank)
    model = new_model().to(device())
    model.load_state_dict(checkpoint["model"])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    opt.load_state_dict(checkpoint["optimizer"])
    _train(mine, model, opt)
    every = [None] * info.world_size
    dist.all_gather_object(every, mine)
    first = []
    for name in sorted(os.listdir(workdir)):
        if name.startswith("seen-first-") and name.endswith(".json"):
            with open(os.path.join(workdir, name)) as f:
                first.append(json.load(f))
    return {**count(first, every), "first_world": len(first), "resumed_world": info.world_size}


def count(first: list[list[int]], resumed: list[list[int]]) -> dict:
    """How often each sample was trained on in the epoch, both jobs together."""
    times = [0] * SAMPLES
    for part in (*first, *resumed):
        for i in part:
            times[i] += 1
    twice = [i for i, n in enumerate(times) if n > 1]
    never = [i for i, n in enumerate(times) if n == 0]
    # positions in the epoch's order (the permutation), to draw where they fall
    whole = DistributedSampler(range(SAMPLES), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    order = list(whole)
    return {"twice": len(twice), "never": len(never), "misplaced": len(twice) + len(never),
            "times_in_order": [times[i] for i in order]}
