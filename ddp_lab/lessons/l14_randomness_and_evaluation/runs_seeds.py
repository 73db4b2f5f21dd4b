"""What each rank runs for lesson 14's seeding bugs: dropout masks and batches under one seed
per rank or one seed for all, a Python-level random choice made while building the model, and
random crops drawn in DataLoader workers."""
from __future__ import annotations

import hashlib
import random

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ...rankinfo import ddp_kwargs, device, rank_info
from .modules import FEATURES, DropoutNet, RandomCrops, ShuffledNet, reseed_worker

INIT_SEED = 0      # the model's initialisation: the same on every rank
DATA_SEED = 1234   # data, augmentation and dropout: + rank, so that every rank draws its own
BATCH = 8


def fingerprint(t: torch.Tensor) -> str:
    """A short digest of a tensor's values: equal digests, equal tensors."""
    data = t.detach().cpu().contiguous().to(torch.uint8 if t.dtype == torch.bool else t.dtype)
    return hashlib.blake2b(data.numpy().tobytes(), digest_size=8).hexdigest()


def all_ranks(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def same_everywhere(per_rank: list[list]) -> int:
    """How many positions hold the same value on every rank."""
    return sum(len(set(column)) == 1 for column in zip(*per_rank))


def train_dropout(seed_per_rank: bool = True, steps: int = 12) -> dict:
    """DDP training of DropoutNet. Returns how many steps drew the same dropout mask, and the
    same batch, on every rank."""
    info, dev = rank_info(), device()
    torch.manual_seed(INIT_SEED)                    # 1. initialisation: one seed for all ranks
    model = DropoutNet().to(dev)
    ddp = DDP(model, **ddp_kwargs(dev))             #    (DDP broadcasts rank 0's weights anyway)
    torch.manual_seed(DATA_SEED + info.rank if seed_per_rank else DATA_SEED)  # 2. data, dropout
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    masks, batches = [], []
    model.drop.register_forward_hook(
        lambda m, args, out: masks.append(fingerprint((args[0] != 0) & (out == 0))))
    for _ in range(steps):
        x = torch.randn(BATCH, FEATURES).to(dev)    # stands for a shuffled, augmented batch
        batches.append(fingerprint(x))
        loss = nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    same_masks, same_batches = same_everywhere(all_ranks(masks)), same_everywhere(all_ranks(batches))
    return {"steps": steps, "same_masks": same_masks, "same_batches": same_batches,
            "identical": same_masks / steps}


def train_shuffled(shared_init_seed: bool = True, steps: int = 10) -> dict:
    """DDP training of ShuffledNet built after seeding Python's `random` (and torch) with the
    rank (broken) or with one seed for all ranks (fixed). Returns the feature order each rank
    built, and how far apart the ranks' outputs are on one probe batch after training."""
    info, dev = rank_info(), device()
    seed = INIT_SEED if shared_init_seed else INIT_SEED + info.rank
    random.seed(seed)
    torch.manual_seed(seed)
    model = ShuffledNet().to(dev)
    ddp = DDP(model, **ddp_kwargs(dev))             # the weights agree; model.order DDP never sees
    random.seed(DATA_SEED + info.rank)
    torch.manual_seed(DATA_SEED + info.rank)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    target = torch.arange(1.0, FEATURES + 1).to(dev)
    for _ in range(steps):
        x = torch.randn(BATCH, FEATURES).to(dev)
        loss = nn.functional.mse_loss(ddp(x).squeeze(1), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    probe = torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(7)).to(dev)
    with torch.no_grad():
        out = model(probe).cpu()
    outs, orders = all_ranks(out), all_ranks(model.order)
    return {"order": model.order, "orders": orders,
            "order_differs": sum(a != b for a, b in zip(orders[0], orders[-1])),
            "divergence": float(max((o - outs[0]).abs().max() for o in outs))}


def crop_offsets(seed_workers: bool = True, worker_init_fn=reseed_worker, epochs: int = 2,
                 size: int = 16) -> dict:
    """Two epochs of a DataLoader (2 workers) over this rank's DistributedSampler shard of
    RandomCrops. Fixed: `worker_init_fn` reseeds each worker from the seed PyTorch gives it,
    drawn from a DataLoader generator seeded by rank. Returns the crop offsets every rank saw, and the
    fraction of them that repeat an offset drawn elsewhere (another worker, rank or epoch)."""
    info = rank_info()
    data = RandomCrops(size)
    sampler = DistributedSampler(data, shuffle=True, seed=DATA_SEED)
    extra = ({"worker_init_fn": worker_init_fn,
              "generator": torch.Generator().manual_seed(DATA_SEED + info.rank)}
             if seed_workers else {})
    loader = DataLoader(data, batch_size=2, sampler=sampler, num_workers=2,
                        multiprocessing_context="fork", **extra)
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen += [(epoch, int(i), int(o)) for idx, off in loader for i, o in zip(idx, off)]
    everyone = [s for rank_seen in all_ranks(seen) for s in rank_seen]
    offsets = [o for _, _, o in everyone]
    repeats = len(offsets) - len(set(offsets))
    return {"draws": len(offsets), "repeats": repeats, "repeated": repeats / len(offsets),
            "seen": seen}
