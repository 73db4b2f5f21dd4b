"""The custom modules of lesson 05: state carried across steps, an in-place edit of a saved
tensor, checkpointed regions with side effects, and a block checkpointed twice.

Each broken module has a fixed twin; every class builds with no arguments.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

FEATURES = 16


def example_batch(rank: int, batch: int = 8, features: int = FEATURES) -> torch.Tensor:
    """A float32 batch, different on each rank."""
    return torch.randn(batch, features, generator=torch.Generator().manual_seed(100 + rank))


# --- 1. State carried from one step to the next ---------------------------------------------------

class ContextNet(nn.Module):
    """Keeps a running context of its features across calls (like an RNN's hidden state) and
    adds it to every batch before the head."""

    def __init__(self, features: int = FEATURES):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(features))
        self.shift = nn.Parameter(torch.zeros(features))
        self.head = nn.Linear(features, 1)
        self.context = None

    def carry(self, context):
        return context  # the graph that produced it comes along

    def forward(self, x):
        h = torch.tanh(x * self.gain + self.shift)
        new = h.mean(0)
        self.context = new if self.context is None else 0.9 * self.context + 0.1 * new
        out = self.head(h + self.context)
        self.context = self.carry(self.context)
        return out


class ContextNetFixed(ContextNet):
    def carry(self, context):
        return context.detach()  # keep the value, drop the graph of past steps


class RecurrentCell(nn.Module):
    """h_t = tanh(W h_{t-1} + U x_t), with h carried from one training step to the next."""

    def __init__(self, features: int = FEATURES):
        super().__init__()
        self.w = nn.Linear(features, features, bias=False)
        self.u = nn.Linear(features, features)
        self.head = nn.Linear(features, 1)
        self.h = None

    def carry(self, h):
        return h

    def forward(self, x):
        h = torch.zeros_like(x) if self.h is None else self.h
        h = torch.tanh(self.w(h) + self.u(x))
        self.h = self.carry(h)
        return self.head(h)


class RecurrentCellFixed(RecurrentCell):
    def carry(self, h):
        return h.detach()


# --- 2. An in-place edit of a tensor autograd saved ---------------------------------------------

class AttentionPool(nn.Module):
    """Pools features with attention weights computed by a hand-written softmax."""

    def __init__(self, features: int = FEATURES):
        super().__init__()
        self.score = nn.Linear(features, features)
        self.head = nn.Linear(features, 1)

    def forward(self, x):
        weights = torch.exp(self.score(x))
        weights /= weights.sum(-1, keepdim=True)  # in place: exp saved its output for backward
        return self.head(weights * x)


class AttentionPoolFixed(AttentionPool):
    def forward(self, x):
        weights = torch.exp(self.score(x))
        weights = weights / weights.sum(-1, keepdim=True)  # a new tensor; exp's output intact
        return self.head(weights * x)


# --- 3. Checkpointed regions with side effects ---------------------------------------------------

class CheckpointedNet(nn.Module):
    """stem -> a block run under activation checkpointing -> head. `checkpointed=False` builds
    the same net without checkpointing (the reference the gradients are compared with)."""

    use_reentrant = False
    preserve_rng_state = True

    def __init__(self, block: nn.Module, features: int = FEATURES, checkpointed: bool = True):
        super().__init__()
        self.stem = nn.Linear(features, features)
        self.block = block
        self.head = nn.Linear(features, 1)
        self.checkpointed = checkpointed

    def run(self, fn, *args):
        """`fn(*args)`, checkpointed: its activations are dropped and recomputed in backward."""
        if not self.checkpointed:
            return fn(*args)
        return checkpoint(fn, *args, use_reentrant=self.use_reentrant,
                          preserve_rng_state=self.preserve_rng_state)

    def forward(self, x):
        return self.head(self.run(self.block, torch.tanh(self.stem(x))))


class MemoryBlock(nn.Module):
    """Attends over a memory of past batch summaries; `forward` also appends to the memory."""

    def __init__(self, features: int = FEATURES):
        super().__init__()
        self.proj = nn.Linear(features, features)
        self.memory: list[torch.Tensor] = []

    def remember(self, h):
        self.memory.append(h.detach().mean(0))

    def attend(self, h):
        mem = torch.stack(self.memory)
        h = torch.tanh(self.proj(h))
        return h + torch.softmax(h @ mem.t(), -1) @ mem

    def forward(self, h):
        self.remember(h)  # a side effect inside the region that will be recomputed
        return self.attend(h)


class MemoryNet(CheckpointedNet):
    def __init__(self, features: int = FEATURES, checkpointed: bool = True):
        super().__init__(MemoryBlock(features), features, checkpointed)


class MemoryNetFixed(MemoryNet):
    def forward(self, x):
        h = torch.tanh(self.stem(x))
        self.block.remember(h)  # the side effect, once, outside the checkpointed region
        return self.head(self.run(self.block.attend, h))


class WarmupBlock(nn.Module):
    """Ramps its output up over its first calls, counting the calls itself."""

    def __init__(self, features: int = FEATURES, warmup: int = 10):
        super().__init__()
        self.proj = nn.Linear(features, features)
        self.warmup = warmup
        self.calls = 0

    def ramp(self) -> float:
        self.calls += 1  # a side effect: a recomputation counts as one more call
        return min(1.0, self.calls / self.warmup)

    def forward(self, h, ramp: float | None = None):
        return torch.tanh(self.proj(h) * (self.ramp() if ramp is None else ramp))


class WarmupNet(CheckpointedNet):
    def __init__(self, features: int = FEATURES, checkpointed: bool = True):
        super().__init__(WarmupBlock(features), features, checkpointed)


class WarmupNetFixed(WarmupNet):
    def forward(self, x):
        ramp = self.block.ramp()  # counted once, outside; the checkpointed call is pure
        return self.head(self.run(self.block, torch.tanh(self.stem(x)), ramp))


class DropoutBlock(nn.Module):
    def __init__(self, features: int = FEATURES):
        super().__init__()
        self.up = nn.Linear(features, 4 * features)
        self.drop = nn.Dropout(0.5)
        self.down = nn.Linear(4 * features, features)

    def forward(self, h):
        return self.down(self.drop(F.gelu(self.up(h))))


class DropoutNet(CheckpointedNet):
    preserve_rng_state = False  # "faster": the recomputation draws a new dropout mask

    def __init__(self, features: int = FEATURES, checkpointed: bool = True):
        super().__init__(DropoutBlock(features), features, checkpointed)


class DropoutNetFixed(DropoutNet):
    preserve_rng_state = True  # the default: recompute with the forward's random state


# --- 4. A block checkpointed twice (weight sharing) ------------------------------------------

class SharedBlockNet(CheckpointedNet):
    """Applies the same block twice (weight sharing), each call checkpointed, the old way."""

    use_reentrant = True

    def __init__(self, features: int = FEATURES, checkpointed: bool = True):
        super().__init__(nn.Linear(features, features), features, checkpointed)

    def forward(self, x):
        h = self.run(self.block, torch.tanh(self.stem(x)))
        h = self.run(self.block, torch.tanh(h))
        return self.head(h)


class SharedBlockNetFixed(SharedBlockNet):
    use_reentrant = False


# --- 5. Depth, activations and checkpointing ---------------------------------------------------

class MLPBlock(nn.Module):
    """A transformer-style MLP block: x + W2 gelu(W1 x), 4x wider inside."""

    def __init__(self, features: int):
        super().__init__()
        self.up = nn.Linear(features, 4 * features)
        self.down = nn.Linear(4 * features, features)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class DeepMLP(nn.Module):
    """`depth` MLP blocks; with `checkpointed`, each block keeps only its input for backward
    and recomputes the rest."""

    def __init__(self, depth: int = 8, features: int = 64, checkpointed: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(features) for _ in range(depth))
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return x
