"""The same attention, its fused weight's rows interleaved per rank before the split
([q0 k0 v0 | q1 k1 v1]): each rank's contiguous shard then holds its own heads' q, k and v."""
import torch
from torch import nn
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)


class Attention(nn.Module):
    def __init__(self, dim=16, head_dim=4):
        super().__init__()
        self.head_dim = head_dim
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        h = torch.softmax(q @ k.transpose(-2, -1) / self.head_dim ** 0.5, dim=-1) @ v
        return self.out(h.transpose(1, 2).reshape(b, s, -1))


def parallelize(model, mesh):
    n, dim = mesh.size(), model.qkv.in_features
    rows = torch.arange(3 * dim).view(3, n, dim // n).transpose(0, 1).reshape(-1)
    with torch.no_grad():  # [q | k | v] -> [q0 k0 v0 | q1 k1 v1]
        model.qkv.weight.copy_(model.qkv.weight[rows])
        model.qkv.bias.copy_(model.qkv.bias[rows])
    parallelize_module(model, mesh, {"qkv": ColwiseParallel(), "out": RowwiseParallel()})
    return model
