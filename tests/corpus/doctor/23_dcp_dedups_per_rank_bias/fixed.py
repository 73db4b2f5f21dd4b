"""The same block, each rank's bias slice wrapped as a DTensor Shard(0): DCP then saves every
rank's slice at its own offset and loads each back where it belongs."""
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard
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
    rank, n = mesh.get_local_rank(), mesh.size()
    piece = model.bias.data.chunk(n)[rank].clone()
    model.bias = nn.Parameter(DTensor.from_local(piece, mesh, [Shard(0)]))  # a sharded DTensor
    return model
