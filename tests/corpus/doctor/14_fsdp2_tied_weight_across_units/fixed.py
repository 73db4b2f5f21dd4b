"""A tiny language model whose output head shares the token embedding's weight, sharded with FSDP2
one unit per child. Fix: the embedding and its tied output projection live in one module, so the
shared weight is one unit's (accelerate#4171: the same FSDP group). Modelled on pytorch/pytorch#176076."""
import torch
import torch.nn.functional as F
from torch import nn


class TiedEmbedding(nn.Module):
    """Looks tokens up (ids) or scores hidden states against every token (decode=True)."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, dim) * 0.02)

    def forward(self, x, decode=False):
        return F.linear(x, self.weight) if decode else F.embedding(x, self.weight)


class TinyLM(nn.Module):
    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.tokens = TiedEmbedding(vocab, dim)
        self.block = nn.Sequential(nn.Linear(dim, dim), nn.GELU())

    def forward(self, ids):
        return self.tokens(self.block(self.tokens(ids)), decode=True)
