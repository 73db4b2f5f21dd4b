"""A model whose second layer is gated by a learned vector, sharded with FSDP2 one unit per child.
Fix: the gate is the second layer's own parameter, read inside its own forward, instead of the
first layer's weight read from the parent. Modelled on deepspeedai/DeepSpeed#876."""
import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.gate = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        return self.proj(x) * torch.sigmoid(self.gate)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(16, 16)
        self.layer2 = Gated()

    def forward(self, x):
        h = self.layer1(x)
        return self.layer2(h)
