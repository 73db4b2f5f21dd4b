"""The custom modules of lesson 15, broken beside fixed. Each runs the same arithmetic either
way; what differs is what torch.compile has to assume about it: Python state that changes every
call, a side effect inside a checkpointed function. (Lesson 12's tied model is reused for
FSDP2: `TiedLM`, `TiedLMFixed`.)"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

WIDTH, VOCAB = 64, 64


class Tower(nn.Module):
    """A plain stack of layers, big enough (`depth` x 256 x 256 floats) for DDP to cut its
    gradients into more than one bucket at `bucket_cap_mb=1`."""

    def __init__(self, depth: int = 8, width: int = 256):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class WarmupGate(nn.Module):
    """Broken under torch.compile: ramps its output up over the first `warmup` calls with a
    Python counter. Dynamo treats an int attribute of a module as a constant of the graph and
    guards on its value, so every call compiles a new graph."""

    def __init__(self, width: int = WIDTH, warmup: int = 100):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.warmup = warmup
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * min(1.0, self.calls / self.warmup)


class WarmupGateFixed(nn.Module):
    """Fixed: the counter is a tensor (a buffer: saved with the model, the same on every rank),
    updated in place. The graph reads its value at run time; nothing to guard on."""

    def __init__(self, width: int = WIDTH, warmup: int = 100):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.warmup = warmup
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * (self.calls / self.warmup).clamp(max=1.0)


class WarmupNet(nn.Module):
    def __init__(self, gate_cls=WarmupGate):
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.gate = gate_cls()
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, x):
        return self.out(self.gate(torch.relu(self.inp(x))))


class TokenNet(nn.Module):
    """Embeds a batch of token sequences `(batch, length)` and pools over the real (unmasked)
    positions: the length is whatever each rank's batch has."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, ids, mask):
        h = torch.tanh(self.mix(self.emb(ids))) * mask[..., None]
        return self.out(h.sum(1) / mask.sum(1, keepdim=True))


class LoggedBlock(nn.Module):
    """Broken under torch.compile: a checkpointed MLP that keeps its hidden activation for
    logging from INSIDE the checkpointed function. Dynamo refuses the side effect inside the
    checkpoint (a graph break) and runs the block uncompiled."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.last = None  # what a logging hook reads after the step

    def mlp(self, x):
        h = torch.relu(self.up(x))
        self.last = h.detach()  # the side effect, inside the checkpointed function
        return self.down(h)

    def forward(self, x):
        return x + checkpoint(self.mlp, x, use_reentrant=False)


class LoggedBlockFixed(LoggedBlock):
    """Fixed: the checkpointed function is pure; what is logged is kept outside it, once per
    step (here the block's output)."""

    def mlp(self, x):
        return self.down(torch.relu(self.up(x)))

    def forward(self, x):
        out = checkpoint(self.mlp, x, use_reentrant=False)
        self.last = out.detach()
        return x + out


class CheckpointedNet(nn.Module):
    def __init__(self, block_cls=LoggedBlock, depth: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(block_cls() for _ in range(depth))
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def warmup_net() -> nn.Module:
    return WarmupNet(WarmupGate)


def warmup_net_fixed() -> nn.Module:
    return WarmupNet(WarmupGateFixed)


def checkpointed_net() -> nn.Module:
    return CheckpointedNet(LoggedBlock)


def checkpointed_net_fixed() -> nn.Module:
    return CheckpointedNet(LoggedBlockFixed)


def features(rank: int) -> torch.Tensor:
    """A rank's example batch (the doctor's input for these modules)."""
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(100 + rank))
