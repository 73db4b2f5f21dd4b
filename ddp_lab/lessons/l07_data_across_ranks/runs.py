"""The per-rank code of lesson 07: the dataset, the data pipelines a learner writes (each a
generator `batches(dataset, epochs, batch_size)` yielding `(epoch, (index, x, y))`), and the one
training loop `train` every scenario runs. Every function here runs on a rank."""
from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from ...instruments.probes import gather, module_drift
from ...launching.rankinfo import ddp_kwargs, device, rank_info


# --- the dataset ----------------------------------------------------------------------------

class IndexedDataset(Dataset):
    """`n` samples of a small regression task; sample i is `(i, x_i, y_i)`, so a rank can record
    exactly which samples it trained on."""

    def __init__(self, n: int = 32, features: int = 4, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]

    def keep(self, i: int) -> bool:
        """A data-cleaning filter: every 8th sample (7, 15, 23, 31) is rejected."""
        return i % 8 != 7


# --- data pipelines: each yields (epoch, batch) ------------------------------------------

def shuffled_batches(dataset, epochs: int, batch_size: int):
    """A single-process habit: shuffle=True, no sampler. Every rank walks the whole dataset."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    for epoch in range(epochs):
        for batch in loader:
            yield epoch, batch


def sampler_batches_no_set_epoch(dataset, epochs: int, batch_size: int):
    """DistributedSampler gives each rank its own share, but set_epoch is never called."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    for epoch in range(epochs):
        for batch in loader:
            yield epoch, batch


def distributed_batches(dataset, epochs: int, batch_size: int):
    """The fix: DistributedSampler (rank and world size come from the process group), and
    set_epoch(epoch) before each epoch so the shuffle differs from epoch to epoch."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            yield epoch, batch


def filtered_shard_batches(dataset, epochs: int, batch_size: int):
    """A hand-made shard: every world_size-th sample, then the cleaning filter. The filter
    rejects more samples on one rank than another, so the ranks get different batch counts."""
    info = rank_info()
    mine = [i for i in range(info.rank, len(dataset), info.world_size) if dataset.keep(i)]
    loader = DataLoader(Subset(dataset, mine), batch_size=batch_size)  # drop_last=False
    for epoch in range(epochs):
        for batch in loader:
            yield epoch, batch


def even_filtered_batches(dataset, epochs: int, batch_size: int):
    """Evening the batches: filter first, then let DistributedSampler shard what is left. It
    pads (repeats a few samples) so every rank gets the same number of batches."""
    kept = Subset(dataset, [i for i in range(len(dataset)) if dataset.keep(i)])
    sampler = DistributedSampler(kept, shuffle=True, seed=0)
    loader = DataLoader(kept, batch_size=batch_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            yield epoch, batch


# --- the training loop ---------------------------------------------------------------------

def train(batches=distributed_batches, epochs: int = 3, batch_size: int = 4, n: int = 32,
          join: bool = False) -> dict:
    """DDP training of a linear model on `IndexedDataset(n)` through the pipeline `batches`.
    Each rank records which sample indices it trained on in each epoch; at the end every rank
    gathers every rank's record (a collective) and measures overlap and repetition."""
    info = rank_info()
    torch.manual_seed(0)  # the same seed everywhere: identical models (DDP would broadcast anyway)
    dev = device()
    model = DDP(torch.nn.Linear(4, 1).to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = [[] for _ in range(epochs)]
    steps = 0
    with model.join() if join else contextlib.nullcontext():
        for epoch, (index, x, y) in batches(IndexedDataset(n), epochs, batch_size):
            loss = torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen[epoch] += [int(i) for i in index]
            steps += 1
    return {**data_metrics(gather(seen), n), "rank": info.rank, "steps": steps,
            "epochs": epochs, "batch_size": batch_size, "n": n,
            "drift": module_drift(model.module)}


def data_metrics(seen_by_rank: list[list[list[int]]], n: int) -> dict:
    """From `seen_by_rank[rank][epoch] -> sample indices in the order trained`:
    overlap  -- mean over epochs and rank pairs of |A & B| / |A| (0: disjoint shares),
    repeated -- fraction of (rank, epoch > 0) whose order equals the previous epoch's,
    coverage -- mean over epochs of the fraction of the dataset trained on by some rank."""
    world, epochs = len(seen_by_rank), len(seen_by_rank[0])
    overlaps, repeats, cover = [], [], []
    for e in range(epochs):
        sets = [set(seen_by_rank[r][e]) for r in range(world)]
        overlaps += [len(sets[a] & sets[b]) / max(1, len(sets[a]))
                     for a in range(world) for b in range(world) if a != b]
        cover.append(len(set().union(*sets)) / n)
        if e:
            repeats += [seen_by_rank[r][e] == seen_by_rank[r][e - 1] for r in range(world)]
    return {"overlap": sum(overlaps) / max(1, len(overlaps)),
            "repeated": sum(repeats) / max(1, len(repeats)),
            "coverage": sum(cover) / len(cover), "seen": seen_by_rank}
