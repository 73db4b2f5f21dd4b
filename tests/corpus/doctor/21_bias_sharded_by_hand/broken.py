"""A block whose projection keeps its bias apart (a Linear without bias, plus a bias parameter),
split with tensor parallelism. The plan splits proj's weight by columns; the separate bias stays
whole, so each rank adds 32 bias values to its 16 output features and forward fails."""
import torch
from torch import nn
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)


class Block(nn.Module):
    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.proj = nn.Linear(dim, hidden, bias=False)
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))
        self.out = nn.Linear(hidden, dim)

    def forward(self, x):
        h = torch.relu(self.proj(x) + self.bias)
        return self.out(h)


def parallelize(model, mesh):
    parallelize_module(model, mesh, {"proj": ColwiseParallel(), "out": RowwiseParallel()})
    return model
