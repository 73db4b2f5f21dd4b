"""The custom modules of lesson 12, broken beside fixed. Each is small enough to read in one
cell; what breaks is not the arithmetic but where each weight lives once it is sharded.

`units(model)` is the sharding plan every run of the lesson (and the doctor) uses: each child
with parameters becomes its own FSDP2 unit, then the root -- the usual per-block wrapping.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH = 32, 16


class TiedLM(nn.Module):
    """Broken under per-child sharding: the output projection reads the embedding's weight,
    which lives in another unit (`emb`) and is a shard again once `emb`'s forward is over."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)

    def forward(self, tokens):
        h = torch.tanh(self.mid(self.emb(tokens)))
        return F.linear(h, self.emb.weight)  # the tie: logits = h @ emb.weight.T


class TiedPair(nn.Module):
    """The embedding and the projection that reads it, in ONE module: one unit holds the tie."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)

    def forward(self, tokens=None, h=None):
        return self.emb(tokens) if h is None else F.linear(h, self.emb.weight)


class TiedLMFixed(nn.Module):
    """Fixed: the tie lives inside one child, so the weight is whole whenever it is read."""

    def __init__(self):
        super().__init__()
        self.tied = TiedPair()
        self.mid = nn.Linear(WIDTH, WIDTH)

    def forward(self, tokens):
        return self.tied(h=torch.tanh(self.mid(self.tied(tokens=tokens))))


class RegisteredTie(nn.Module):
    """The other way to tie: one Parameter registered in two children."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, VOCAB, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.mid(self.emb(tokens))))


class Gated(nn.Module):
    """Broken under per-child sharding: forward scales by the norm of a child's weight, read
    in the parent's forward, outside the child's own."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x))) / self.head.weight.norm()


class GatedHead(nn.Module):
    """A head that normalises by its own weight: the read happens inside its own forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, 4)

    def forward(self, h):
        return self.lin(h) / self.lin.weight.norm()


class GatedFixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(WIDTH, WIDTH)
        self.head = GatedHead()

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def mlp() -> nn.Module:
    """The plain model of the training-loop scenarios (penalty, saving, memory)."""
    return nn.Sequential(nn.Linear(WIDTH, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def units(model: nn.Module) -> list[nn.Module]:
    """The sharding plan: every direct child that holds parameters, then the root."""
    return [c for c in model.children() if any(True for _ in c.parameters())] + [model]


def tokens(rank: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, 6), generator=torch.Generator().manual_seed(rank))


def features(rank: int) -> torch.Tensor:
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(100 + rank))
