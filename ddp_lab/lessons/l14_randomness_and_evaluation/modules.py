"""The modules of lesson 14: a network with dropout, a network that makes a Python-level random
choice when it is built, a dropout that owns its generator, an augmentation drawn from NumPy
inside forward, and the dataset whose random crops repeat across DataLoader workers."""
from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

FEATURES = 8


def rank_or_zero() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class DropoutNet(nn.Module):
    """Linear -> dropout -> ReLU -> Linear. The dropout mask is drawn from torch's default
    generator: whatever seed this rank gave torch decides which units it drops."""

    def __init__(self, features: int = FEATURES, hidden: int = 32, p: float = 0.5):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.drop = nn.Dropout(p)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(torch.relu(self.drop(self.inp(x))))


class ShuffledNet(nn.Module):
    """Reads its input features in an order chosen at random once, when it is built (a fixed
    random channel shuffle). The order is a Python list: not a parameter, not a buffer, so DDP
    never broadcasts it. `seed=None` draws it from Python's global `random`; an int draws it from
    a generator of its own, the same on every rank."""

    def __init__(self, features: int = FEATURES, seed: int | None = None):
        super().__init__()
        rng = random if seed is None else random.Random(seed)
        self.order = rng.sample(range(features), features)
        self.lin = nn.Linear(features, 1)

    def forward(self, x):
        return self.lin(x[:, self.order])


class OwnGeneratorDropout(nn.Module):
    """Dropout from a generator the module seeds itself, "for reproducibility". With
    `per_rank=False` the seed is the same on every rank, and so is every mask."""

    def __init__(self, p: float = 0.5, seed: int = 0, per_rank: bool = False):
        super().__init__()
        self.p = p
        self.gen = torch.Generator().manual_seed(seed + (rank_or_zero() if per_rank else 0))

    def forward(self, x):
        if not self.training:
            return x
        keep = torch.rand(x.shape, generator=self.gen, device=self.gen.device) >= self.p
        return x * keep.to(x.device) / (1 - self.p)


class OwnDropoutNet(nn.Module):
    def __init__(self, per_rank: bool = False, features: int = FEATURES):
        super().__init__()
        self.inp = nn.Linear(features, 32)
        self.drop = OwnGeneratorDropout(per_rank=per_rank)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        return self.out(torch.relu(self.drop(self.inp(x))))


class NumpyJitterNet(nn.Module):
    """Adds a random shift to its input in training, drawn from NumPy's global generator
    (`numpy=True`) or from torch's (`numpy=False`)."""

    def __init__(self, numpy: bool = True, features: int = FEATURES):
        super().__init__()
        self.numpy = numpy
        self.lin = nn.Linear(features, 1)

    def forward(self, x):
        if self.training:
            if self.numpy:
                x = x + float(np.random.uniform(-0.1, 0.1))
            else:
                x = x + (torch.rand((), device=x.device) - 0.5) * 0.2
        return self.lin(x)


class RandomCrops(torch.utils.data.Dataset):
    """Sample i comes with the offset of a random crop, drawn from a NumPy generator the dataset
    creates once, in __init__. Every DataLoader worker receives a copy of that generator in the
    same state."""

    def __init__(self, size: int = 16, seed: int = 0):
        self.size = size
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        return i, int(self.rng.integers(2**31))


def reseed_worker(worker_id: int) -> None:
    """worker_init_fn: give this worker's copy of the dataset a generator of its own, seeded by
    the seed PyTorch chose for the worker (from the DataLoader's generator: it differs per rank
    when that generator is seeded by rank, per epoch, and per worker)."""
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)
