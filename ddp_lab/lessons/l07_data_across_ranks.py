"""Lesson 07: data across ranks -- DistributedSampler, set_epoch, uneven inputs and Join.

One training loop (`train`) runs every scenario; what changes is the data pipeline it is given:
a generator `batches(dataset, epochs, batch_size)` yielding `(epoch, (index, x, y))`, the piece
a learner writes. Every function here runs on a rank (through `ddp_lab.launch`).
"""
from __future__ import annotations

import contextlib
from functools import partial

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from ..probes import gather, module_drift
from ..rankinfo import ddp_kwargs, device, rank_info
from ..registry import Expect, Lesson, Scenario, Variant


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


# --- the picture ---------------------------------------------------------------------------

def seen_matrix(seen_by_rank, n: int, batch_size: int):
    """Rows (epoch, rank), columns sample index; value = the step (batch) within the epoch at
    which that rank trained on that sample (NaN: not trained on by that rank in that epoch)."""
    import numpy as np

    world, epochs = len(seen_by_rank), len(seen_by_rank[0])
    grid = np.full((epochs * world, n), np.nan)
    for e in range(epochs):
        for r in range(world):
            for pos, i in enumerate(seen_by_rank[r][e]):
                grid[e * world + r, i] = pos // batch_size
    return grid


def draw_seen(ax, seen_by_rank, n: int, batch_size: int, title: str, vmax: float | None = None):
    """A heat map of `seen_matrix`, one row per (epoch, rank)."""
    grid = seen_matrix(seen_by_rank, n, batch_size)
    world, epochs = len(seen_by_rank), len(seen_by_rank[0])
    image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0, vmax=vmax)
    ax.set_yticks(range(epochs * world), [f"epoch {e} · rank {r}" for e in range(epochs)
                                          for r in range(world)], fontsize=8)
    for e in range(1, epochs):
        ax.axhline(e * world - 0.5, color="white", lw=2)
    ax.set_xlabel("sample index in the dataset")
    ax.set_title(title, fontsize=10)
    return image


def figures(results) -> dict:
    from ..plots import BROKEN, FIXED, figure

    panels = [("no sampler", results["no_sampler"]["broken"], BROKEN),
              ("sampler, no set_epoch", results["no_set_epoch"]["broken"], BROKEN),
              ("sampler + set_epoch", results["no_set_epoch"]["fixed"], FIXED)]
    fig, axes = figure(3, title="Which sample each rank trained on, and when (blank: not on that rank)",
                       width=4.6, height=4.0)
    vmax = max(max(p[1].values[0]["steps"] // p[1].values[0]["epochs"] for p in panels) - 1, 1)
    for ax, (name, result, colour) in zip(axes, panels):
        value = result.values[0]
        image = draw_seen(ax, value["seen"], value["n"], value["batch_size"],
                          f"{name}\noverlap {value['overlap']:.0%}, repeated epochs "
                          f"{value['repeated']:.0%}", vmax=vmax)
        ax.title.set_color(colour)
    fig.colorbar(image, ax=axes, label="training step within the epoch", shrink=0.8)
    return {"samples_seen": fig}


# --- the scenarios -------------------------------------------------------------------------

def _stuck_in_backward(result) -> list[str]:
    """Rank 0 (more batches) must be the one left in DDP's gradient all-reduce, in backward."""
    r0 = result.ranks[0]
    if r0.status != "timeout" or "in backward" not in r0.stack_summary():
        return [f"rank 0 is {r0.status!r}, expected a timeout inside backward()"]
    return []


def _also_zero(name: str, result) -> list[str]:
    """A fixed pipeline must do both: disjoint shares (overlap 0) and a new order every epoch
    (repeated 0); each scenario declares one as its metric and checks the other here."""
    value = result.values[0][name]
    return [f"{name} = {value:.3g}, expected < 1e-06 as well"] if value > 1e-6 else []


LESSON = Lesson(
    id="07",
    error_class="data across ranks",
    title="Data across ranks: DistributedSampler, set_epoch, uneven inputs and Join",
    notebook="07_data_across_ranks",
    figures=figures,
    scenarios=[
        Scenario("no_sampler", "No DistributedSampler: every rank trains on the same samples",
                 broken=Variant(train, Expect("ok", metric="overlap", above=0.99),
                                kwargs={"batches": shuffled_batches}),
                 fixed=Variant(train, Expect("ok", metric="overlap", below=1e-6,
                                             extra=partial(_also_zero, "repeated")),
                               kwargs={"batches": distributed_batches}),
                 summary="shuffle=True on identically seeded ranks gives each the same batches; "
                         "DistributedSampler gives each rank its own share"),
        Scenario("no_set_epoch", "DistributedSampler without set_epoch: the same order every epoch",
                 broken=Variant(train, Expect("ok", metric="repeated", above=0.99),
                                kwargs={"batches": sampler_batches_no_set_epoch}),
                 fixed=Variant(train, Expect("ok", metric="repeated", below=1e-6,
                                             extra=partial(_also_zero, "overlap")),
                               kwargs={"batches": distributed_batches}),
                 summary="the sampler shuffles with seed + epoch; without set_epoch every epoch "
                         "repeats the first one's order"),
        Scenario("uneven_inputs", "Uneven inputs: the rank with more batches waits forever",
                 broken=Variant(train, Expect("timeout", match="all_gather", ranks=(1,),
                                              extra=_stuck_in_backward),
                                kwargs={"batches": filtered_shard_batches}, timeout=3, grace=2),
                 fixed=Variant(train, Expect("ok", metric="drift", below=1e-6),
                               kwargs={"batches": filtered_shard_batches, "join": True}),
                 summary="rank 0 has 12 batches, rank 1 has 9: rank 0 waits in its 10th gradient "
                         "all-reduce; `with model.join():` shadows it (or even the batches)"),
    ],
)
