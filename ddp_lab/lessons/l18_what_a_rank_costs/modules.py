"""Lesson 18's modules. None of them is wrong: what a rank costs comes from how they are trained,
launched and wrapped."""
from __future__ import annotations

import torch
import torch.nn as nn

WIDTH = 64


class Net(nn.Module):
    """A small MLP: three layers of WIDTH units."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                    nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, x):
        return self.layers(x)


class FeatureGains(nn.Module):
    """A learnable gain for each of `groups` feature groups: many small parameters (here 256
    of 16,384 floats, 64 KiB each: 16 MiB in all), the shape of per-channel scales, adapters
    or embeddings kept one parameter per group."""

    def __init__(self, groups: int = 256, size: int = 16_384):
        super().__init__()
        self.gains = nn.ParameterList(nn.Parameter(torch.ones(size)) for _ in range(groups))

    def forward(self, x):  # x: (batch, size), one row of features shared by every group
        return torch.stack([(x * g).mean() for g in self.gains]).sum()
