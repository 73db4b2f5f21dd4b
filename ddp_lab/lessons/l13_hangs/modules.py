"""The model the lesson's training loops use: small, with a BatchNorm, whose running statistics
DDP broadcasts from rank 0 at the start of a forward that follows a grad-enabled one -- the first
evaluation forward after training too, even under no_grad (`require_forward_param_sync`, torch
2.13's torch/nn/parallel/distributed.py:1781 and 1828-1841)."""
from __future__ import annotations

from torch import nn


class Classifier(nn.Module):
    """Linear -> BatchNorm -> ReLU -> Linear: what "log on rank 0 only" evaluates."""

    def __init__(self, d_in: int = 8, hidden: int = 16, d_out: int = 2):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU())
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.head(self.body(x))
