"""The same block, its separate bias sharded by hand like proj's output features: a DTensor
Shard(0), added to proj's output kept as a DTensor (use_local_output=False), so DTensor adds
each rank's bias slice to its features."""
import torch
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor
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
    plan = {"proj": ColwiseParallel(use_local_output=False), "out": RowwiseParallel()}
    parallelize_module(model, mesh, plan)
    model.bias = nn.Parameter(distribute_tensor(model.bias.data, mesh, [Shard(0)]))
    return model
