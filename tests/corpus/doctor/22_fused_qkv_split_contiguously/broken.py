"""Self-attention with one fused q/k/v projection (as GPT-2's c_attn), split with
ColwiseParallel. The fused weight's rows are [q | k | v]; split contiguously over 2 ranks,
rank 0 holds all of q and half of k, so chunk(3) on a rank's output mixes q, k and v."""
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
    parallelize_module(model, mesh, {"qkv": ColwiseParallel(), "out": RowwiseParallel()})
    return model
