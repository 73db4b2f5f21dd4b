"""A model whose second layer is also fed the first layer's weight (a learned gate), sharded with
FSDP2 one unit per child. Bug: the parent's forward reads layer1.weight outside layer1's forward,
where FSDP2 holds only this rank's shard. Modelled on deepspeedai/DeepSpeed#876 (ZeRO-3's
external parameters)."""
import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x, gate):
        return self.proj(x) * torch.sigmoid(gate.sum(0))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(16, 16)
        self.layer2 = Gated()

    def forward(self, x):
        h = self.layer1(x)
        return self.layer2(h, self.layer1.weight)
