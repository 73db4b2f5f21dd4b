"""What each rank runs for lesson 14's evaluation and loss bugs: accuracy under a padding
DistributedSampler, a loss logged from rank 0, a loss normalised by each rank's own count."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ...rankinfo import ddp_kwargs, device, rank_info
from .modules import FEATURES
from .runs_seeds import INIT_SEED, all_ranks

EVAL_SIZE, CLASSES = 9, 3  # 9 samples on 2 ranks: the sampler pads one
BATCH = 8
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
