"""Lesson 09's model (the bugs are in how it is saved and loaded, not in the module)."""
from __future__ import annotations

import torch
import torch.nn as nn


class Net(nn.Module):
    """The model every scenario checkpoints. Its BatchNorm keeps running statistics that each
    rank updates from its own batch, so ranks hold different buffers between forwards."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))
