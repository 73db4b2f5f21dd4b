"""A plain 10-layer MLP, the doctor's timing example (docs/measured.md)
(`time ddp-lab doctor ten_layers.py:TenLayers --input "torch.randn(32, 64)"`): nothing wrong
with it, so the doctor finds nothing, and its wall time is the doctor's own cost."""
import torch
from torch import nn


class TenLayers(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 10):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
