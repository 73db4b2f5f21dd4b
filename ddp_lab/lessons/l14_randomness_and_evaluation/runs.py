"""What each rank runs in lesson 14 (through `ddp_lab.launch`): the seeding bugs (dropout masks
and batches under one seed for all ranks or one per rank, a Python-level random choice made while
building the model, random crops drawn in DataLoader workers), then the evaluation and loss bugs
(accuracy under a padding DistributedSampler, a loss logged from rank 0, a loss normalised by each
rank's own count)."""
from __future__ import annotations

import hashlib
import random

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import FEATURES, DropoutNet, RandomCrops, ShuffledNet, reseed_worker

INIT_SEED = 0      # the model's initialisation: the same on every rank
DATA_SEED = 1234   # augmentation, dropout and drawn batches: + rank, so every rank draws its own
#                    (a DistributedSampler takes DATA_SEED alike on every rank: it splits by rank)
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
    torch.manual_seed(DATA_SEED + info.rank if seed_per_rank else DATA_SEED)  # 2. batches, dropout
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


# --- evaluation and losses ----------------------------------------------------------------------

EVAL_SIZE, CLASSES = 9, 3  # 9 samples on 2 ranks: the sampler pads one
METHODS = ("mean_of_ranks", "gather", "sum_count", "drop_last")


def eval_set(size: int = EVAL_SIZE):
    """Integer-valued features and classifier weights (the logits are exact, no ties), and
    labels the classifier gets right about two times in three."""
    g = torch.Generator().manual_seed(14)
    x = torch.randint(-3, 4, (size, FEATURES), generator=g).float()
    w = torch.randint(-2, 3, (CLASSES, FEATURES), generator=g).float()
    pred = (x @ w.T).argmax(1)
    wrong = torch.rand(size, generator=g) < 0.35
    return x, torch.where(wrong, (pred + 1) % CLASSES, pred), w


def correct_on(indices: list[int]) -> list[int]:
    """1 where the classifier gets sample i right."""
    x, y, w = eval_set()
    pred = (x[indices] @ w.T).argmax(1)
    return (pred == y[indices]).int().tolist()


def _sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def evaluate(method: str = "gather") -> dict:
    """Accuracy over the EVAL_SIZE samples, computed by every method in METHODS on this rank's
    DistributedSampler shard, beside one process's accuracy over the whole set. `error` is
    |accuracy by `method` - one process's|; `accuracy` maps each method to (numerator,
    denominator) or, for the mean of rank means, to the value."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    info = rank_info()
    padded = list(DistributedSampler(range(EVAL_SIZE), shuffle=False))
    mine = correct_on(padded)
    real = [c for k, c in enumerate(mine) if info.rank + k * info.world_size < EVAL_SIZE]
    acc = {"one_process": sum(correct_on(list(range(EVAL_SIZE)))) / EVAL_SIZE}
    acc["mean_of_ranks"] = _sum(sum(mine) / len(mine))[0] / info.world_size
    pairs = {i: c for rank_pairs in all_ranks(list(zip(padded, mine))) for i, c in rank_pairs}
    acc["gather"] = sum(pairs.values()) / len(pairs)              # padding dropped by index
    hits, count = _sum(sum(real), len(real))
    acc["sum_count"] = hits / count                                # padding dropped by position
    kept = list(DistributedSampler(range(EVAL_SIZE), shuffle=False, drop_last=True))
    hits_kept, count_kept = _sum(sum(correct_on(kept)), len(kept))
    acc["drop_last"] = hits_kept / count_kept
    return {"accuracy": acc, "padded_shard": padded, "counted": {"gather": len(pairs),
            "sum_count": int(count), "drop_last": int(count_kept)},
            "error": abs(acc[method] - acc["one_process"])}


def shard(rank: int, step: int):
    """Rank r's batch: targets with noise that grows with the rank (rank 1 reads a harder
    shard), the same for any world size."""
    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, x.sum(1, keepdim=True) + (1 + 3 * rank) * torch.randn(BATCH, 1, generator=g)



def log_loss(all_reduce: bool = True, steps: int = 12) -> dict:
    """DDP training; each step logs the loss rank 0 sees (broken) or the loss all-reduced over
    ranks (fixed), beside the loss of the same model on every rank's batch at once. `error` is
    the largest |logged - global| / global over the steps."""
    info, dev = rank_info(), device()
    torch.manual_seed(INIT_SEED)
    model = nn.Linear(FEATURES, 1).to(dev)
    ddp = DDP(model, **ddp_kwargs(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    local, reduced, glob = [], [], []
    for step in range(steps):
        x, y = (t.to(dev) for t in shard(info.rank, step))
        with torch.no_grad():
            parts = [shard(r, step) for r in range(info.world_size)]
            gx, gy = (torch.cat(p).to(dev) for p in zip(*parts))
            glob.append(nn.functional.mse_loss(model(gx), gy).item())
        loss = nn.functional.mse_loss(ddp(x), y)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        local.append(loss.item())
        reduced.append(mean.item() / info.world_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
    logged = reduced if all_reduce else local
    return {"local": local, "all_reduced": reduced, "global": glob, "logged": logged,
            "error": max(abs(a - b) / b for a, b in zip(logged, glob))}


def token_batch(rank: int):
    """Rank r's padded batch of 4 sequences x 8 tokens: rank 0's are nearly full, rank 1's
    mostly padding. Returns features, targets and the mask of real tokens."""
    g = torch.Generator().manual_seed(60 + rank)
    x = torch.randn(4, 8, FEATURES, generator=g)
    y = x.sum(-1) + torch.randn(4, 8, generator=g)
    keep = 0.9 if rank == 0 else 0.2
    mask = torch.rand(4, 8, generator=g) < keep
    return x, y, mask


def masked_loss(model, x, y, mask, count):
    return ((model(x).squeeze(-1) - y) ** 2 * mask).sum() / count


def normalised_grads(global_count: bool = True) -> dict:
    """One DDP backward of a token loss normalised by this rank's count of real tokens (broken)
    or by the count over all ranks (fixed; times world_size, since DDP averages gradients),
    against one process's gradient of the mean over every real token of the global batch.
    `error` is ||DDP's gradient - one process's|| / ||one process's||."""
    info, dev = rank_info(), device()
    torch.manual_seed(INIT_SEED)
    model = nn.Linear(FEATURES, 1).to(dev)
    ref = nn.Linear(FEATURES, 1).to(dev)
    ref.load_state_dict(model.state_dict())
    ddp = DDP(model, **ddp_kwargs(dev))
    x, y, mask = (t.to(dev) for t in token_batch(info.rank))
    count = mask.sum().float()
    if global_count:
        dist.all_reduce(count)                        # every rank divides by the global count
        count = count / info.world_size               # DDP's average multiplies by 1/world_size
    masked_loss(ddp, x, y, mask, count).backward()
    parts = [token_batch(r) for r in range(info.world_size)]
    gx, gy, gm = (torch.cat(p).to(dev) for p in zip(*parts))
    masked_loss(ref, gx, gy, gm, gm.sum().float()).backward()
    mine = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    truth = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    return {"tokens": all_ranks(int(mask.sum())),
            "error": float((mine - truth).norm() / truth.norm())}
