"""What every scenario of lesson 09 shares: a short DDP training run of `modules.Net`, fingerprints
and checksums of state_dicts, and a temporary directory every rank sees. Runs on a rank."""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import gather
from ...launching.rankinfo import ddp_kwargs, rank_info, scratch_dir
from .modules import Net


def fingerprint(state: dict) -> str:
    """8 hex digits that change with any value in a state_dict (names ignored)."""
    h = hashlib.sha1()
    for value in state.values():
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:8]


def checksum(state: dict) -> float:
    """The sum of every value in a state_dict: one number to plot per rank."""
    return float(sum(v.detach().double().sum() for v in state.values()))


@contextlib.contextmanager
def shared_tmpdir(path: str | None = None):
    """A directory every rank sees: rank 0 makes a temporary one (unless `path` is given) and
    broadcasts its path (a collective); the last rank to leave the block removes it."""
    info = rank_info()
    box = [tempfile.mkdtemp(prefix="ddp-lab-ckpt-", dir=scratch_dir()) if path is None and info.is_main else path]
    dist.broadcast_object_list(box, src=0)
    try:
        yield box[0]
    finally:
        if path is None:
            _leave(box[0], info.rank, info.world_size)


def _leave(d: str, rank: int, world_size: int) -> None:
    """Mark this rank done; whoever sees every rank done removes the directory. No collective,
    so it also runs when a rank leaves with an error while another still reads the file."""
    done = [os.path.join(d, f".rank{r}-done") for r in range(world_size)]
    open(done[rank], "w").close()
    if all(os.path.exists(p) for p in done):
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def count_saves():
    """Count this rank's calls to torch.save inside the block: `with count_saves() as n: ...`,
    then `n[0]`."""
    calls, real = [0], torch.save

    def save(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    torch.save = save
    try:
        yield calls
    finally:
        torch.save = real


def train(dev, steps: int = 3, seed: int = 0) -> DDP:
    """A few DDP steps; every rank starts from the same weights and draws its own batches."""
    torch.manual_seed(seed)
    model = DDP(Net().to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed + 1 + rank_info().rank)
    for _ in range(steps):
        x, y = torch.randn(16, 8, generator=g).to(dev), torch.randn(16, 4, generator=g).to(dev)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def compare_with_checkpoint(trained: DDP, state: dict, **extra) -> dict:
    """What this rank holds after loading, against the state rank 0 saved (a collective)."""
    rank0 = gather(fingerprint(trained.module.state_dict()))[0]
    got = fingerprint(state)
    return {**extra, "is_checkpoint": got == rank0, "mismatch": float(got != rank0),
            "checksum": checksum(state), "holds": "rank 0's state" if got == rank0 else "another state"}
