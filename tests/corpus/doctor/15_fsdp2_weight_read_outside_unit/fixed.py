"""A model that gates its output with a vector computed from its first layer's weight, sharded
with FSDP2 one unit per child. Fix: the first layer computes the gate in its own forward, where
FSDP2 has gathered its weight. Modelled on deepspeedai/DeepSpeed#876."""
import torch
from torch import nn


class GatedLinear(nn.Linear):
    """A Linear layer that also returns a gate made from its own weight."""

    def forward(self, x):
        return super().forward(x), torch.sigmoid(self.weight.sum(0))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = GatedLinear(16, 16)
        self.layer2 = nn.Linear(16, 16)

    def forward(self, x):
        h, gate = self.layer1(x)
        return self.layer2(h) * gate
