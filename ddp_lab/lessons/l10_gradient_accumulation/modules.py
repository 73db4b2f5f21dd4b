"""Lesson 10's model: a small two-layer net (the bug is in how it is trained, not in the module)."""
from __future__ import annotations

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))
