"""An MLP that rescales its hidden activations when their largest value grows past 1, trained
under torch.compile(fullgraph=True). Fix: the scale stays a tensor (clamp instead of a branch on
.item()), so the whole forward is one graph. Modelled on pytorch/pytorch#158642."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = h / h.detach().abs().max().clamp(min=1.0)
        return self.fc2(torch.relu(h))
