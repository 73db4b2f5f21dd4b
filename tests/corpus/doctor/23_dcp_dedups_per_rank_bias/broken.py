"""A block whose separate bias is sharded by hand into a plain tensor per rank (this rank's
slice), beside a column-parallel projection. Forward is right; torch.distributed.checkpoint
takes a plain tensor for a replicated one and saves one rank's slice."""
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
    rank, n = mesh.get_local_rank(), mesh.size()
    model.bias = nn.Parameter(model.bias.data.chunk(n)[rank].clone())  # this rank's slice
    return model
