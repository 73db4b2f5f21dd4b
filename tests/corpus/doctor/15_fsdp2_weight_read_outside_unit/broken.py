"""A model that gates its output with a vector computed from its first layer's weight, sharded
with FSDP2 one unit per child. Bug: the parent's forward reads layer1.weight outside layer1's
forward, where FSDP2 holds only this rank's shard. Modelled on deepspeedai/DeepSpeed#876 (ZeRO-3's
external parameters: a weight used in ModuleZ3.forward, outside its own module)."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(16, 16)
        self.layer2 = nn.Linear(16, 16)

    def forward(self, x):
        h = self.layer1(x)
        gate = torch.sigmoid(self.layer1.weight.sum(0))
        return self.layer2(h) * gate
