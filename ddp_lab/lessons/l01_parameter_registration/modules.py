"""The modules of lesson 01: each broken one looks right, and each fix is the smallest change.

All take 8 input features and return one output per example, so one training loop runs them all.
"""
from __future__ import annotations

import torch
from torch import nn

FEATURES = 8


# 1. A trainable tensor kept as a plain attribute ------------------------------------------------
class GainNet(nn.Module):
    """A learnable per-feature gain in front of a linear layer. The gain is a plain tensor."""

    def __init__(self):
        super().__init__()
        self.gain = torch.randn(FEATURES, requires_grad=True)  # BUG: not an nn.Parameter
        self.linear = nn.Linear(FEATURES, 1)

    def forward(self, x):
        return self.linear(x * self.gain)


class GainNetFixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.randn(FEATURES))  # registered: DDP syncs it
        self.linear = nn.Linear(FEATURES, 1)

    def forward(self, x):
        return self.linear(x * self.gain)


# 2. Sub-modules and parameters in plain Python lists --------------------------------------------
class StackNet(nn.Module):
    """A stack of blocks, each with its own scale. Both live in plain Python lists."""

    def __init__(self, depth: int = 2):
        super().__init__()
        self.blocks = [nn.Linear(FEATURES, FEATURES) for _ in range(depth)]  # BUG: plain list
        self.scales = [nn.Parameter(torch.ones(FEATURES)) for _ in range(depth)]  # BUG: plain list
        self.head = nn.Linear(FEATURES, 1)

    def forward(self, x):
        for block, scale in zip(self.blocks, self.scales):
            x = torch.tanh(block(x)) * scale
        return self.head(x)


class StackNetFixed(nn.Module):
    def __init__(self, depth: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(FEATURES, FEATURES) for _ in range(depth))
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(FEATURES)) for _ in range(depth))
        self.head = nn.Linear(FEATURES, 1)

    def forward(self, x):
        for block, scale in zip(self.blocks, self.scales):
            x = torch.tanh(block(x)) * scale
        return self.head(x)


# 3. Nothing registered at all -------------------------------------------------------------------
class BareLinear(nn.Module):
    """A linear model written by hand, with tensors instead of parameters."""

    def __init__(self):
        super().__init__()
        self.weight = torch.randn(FEATURES, 1, requires_grad=True)  # BUG
        self.bias = torch.zeros(1, requires_grad=True)  # BUG

    def forward(self, x):
        return x @ self.weight + self.bias


class BareLinearFixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(FEATURES, 1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return x @ self.weight + self.bias


# 4. A parameter the forward pass leaves unused --------------------------------------------------
class AuxHeadNet(nn.Module):
    """A body, a head, and an auxiliary head kept for a later experiment: forward never uses it."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.body = nn.Linear(FEATURES, hidden)
        self.head = nn.Linear(hidden, 1)
        self.aux_head = nn.Linear(hidden, 1)  # BUG (under DDP): never used in forward

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class AuxHeadNetFixed(nn.Module):
    """The smallest fix: the head that forward does not use is not in the module."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.body = nn.Linear(FEATURES, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class AlternatingNet(nn.Module):
    """Two heads taking turns, one per call: which parameters are used changes every step."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.body = nn.Linear(FEATURES, hidden)
        self.heads = nn.ModuleList(nn.Linear(hidden, 1) for _ in range(2))
        self.calls = 0

    def forward(self, x):
        head = self.heads[self.calls % 2]
        self.calls += 1
        return head(torch.relu(self.body(x)))


# 5. The plain model that DataParallel and DDP both wrap -----------------------------------------
class SmallNet(nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.body = nn.Linear(FEATURES, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def example_batch(rank: int, batch: int = 16) -> torch.Tensor:
    """Rank `rank`'s batch: each rank reads different data, as a DistributedSampler gives it."""
    return torch.randn(batch, FEATURES, generator=torch.Generator().manual_seed(1000 + rank))
