"""An MLP that rescales its hidden activations when their largest value, read with .item(), grows
past 1, trained under torch.compile(fullgraph=True). Bug: a Python branch on .item() depends on a
tensor's value, which fullgraph cannot capture in one graph. Modelled on pytorch/pytorch#158642."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = self.fc1(x)
        if h.detach().abs().max().item() > 1.0:
            h = h / h.detach().abs().max()
        return self.fc2(torch.relu(h))
