"""Lesson 19's modules. Nothing in them is wrong: the drift comes from what is done to them after
they are wrapped, how they are clipped, and how ranks exchange what they computed."""
from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """A body and a head: the model that a cast or a new head changes after wrapping."""

    def __init__(self, features: int = 8, hidden: int = 16):
        super().__init__()
        self.body = nn.Linear(features, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class Block(nn.Module):
    """An MLP block with a LayerNorm after it: under tensor parallelism `up` is split by columns,
    `down` by rows, its bias left whole (a Replicate DTensor: RowwiseParallel, torch/distributed/
    tensor/parallel/style.py:266-277), and `norm` stays a plain parameter, whole on every rank."""

    def __init__(self, width: int = 8, hidden: int = 32):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.down(torch.relu(self.up(x))))

    @staticmethod
    def tp_plan() -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"up": ColwiseParallel(), "down": RowwiseParallel()}
