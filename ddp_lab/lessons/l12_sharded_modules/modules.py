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


class Adapted(nn.Module):
    """A block with a frozen part: a pretrained `base` the fine-tuning keeps fixed, plus a
    small trainable low-rank adapter (`down`, `up`) beside it, all in one FSDP2 unit."""

    def __init__(self, rank: int = 4):
        super().__init__()
        self.base = nn.Linear(WIDTH, WIDTH)
        self.down = nn.Linear(WIDTH, rank, bias=False)
        self.up = nn.Linear(rank, WIDTH, bias=False)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


def adapted() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), Adapted(), nn.Linear(WIDTH, 4))


class Scaled(nn.Module):
    """Broken under FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16): the policy casts the
    parameters, not the buffer `scale` nor the plain tensor `shift`, so `h * scale + shift`
    is float32 again and the next Linear (bfloat16 weights) refuses it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, 4)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, WIDTH))
        self.shift = torch.linspace(-1.0, 1.0, WIDTH)  # a constant, not registered

    def forward(self, x):
        h = self.lin(x)
        return self.out(h * self.scale + self.shift)


class ScaledFixed(Scaled):
    """Fixed: the constants' arithmetic in float32 on purpose, handed back in the dtype the
    next layer computes in."""

    def forward(self, x):
        h = self.lin(x)
        return self.out((h.float() * self.scale + self.shift).to(h.dtype))


def scaled_net(block=Scaled) -> nn.Module:
    """The block inside a model: the sharding plan makes the whole block one unit."""
    return nn.Sequential(block(), nn.Linear(4, 4))


def scaled_net_fixed() -> nn.Module:
    return scaled_net(ScaledFixed)


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
