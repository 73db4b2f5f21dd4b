"""The modules of lesson 02: constants and working tensors that must follow the module's device
and dtype, and a module built on the meta device.

Each class says what batch it eats with `input_shape` (batch first).
"""
from __future__ import annotations

import math

import torch
from torch import nn

FEATURES = 8


# 1. Constant tensors kept as plain attributes ---------------------------------------------------
class RandomFeatures(nn.Module):
    """Random Fourier features: a fixed random projection `freqs` and fixed `phases`, then a
    trained linear read-out. Neither constant is trained, so both are kept as plain tensors."""

    input_shape = (16, FEATURES)

    def __init__(self, n_features: int = 16):
        super().__init__()
        self.freqs = torch.randn(FEATURES, n_features)  # BUG: plain attribute
        self.phases = torch.linspace(0, math.pi, n_features)  # BUG: plain attribute
        self.out = nn.Linear(2 * n_features, 1)

    def forward(self, x):
        z = x @ self.freqs + self.phases
        return self.out(torch.cat([z.sin(), z.cos()], dim=-1))


class RandomFeaturesFixed(nn.Module):
    input_shape = (16, FEATURES)

    def __init__(self, n_features: int = 16):
        super().__init__()
        # random: saved in the state_dict, or a reloaded model gets other features
        self.register_buffer("freqs", torch.randn(FEATURES, n_features))
        # computed from the shape alone: rebuilt by __init__, so kept out of the state_dict
        self.register_buffer("phases", torch.linspace(0, math.pi, n_features), persistent=False)
        self.out = nn.Linear(2 * n_features, 1)

    def forward(self, x):
        z = x @ self.freqs + self.phases
        return self.out(torch.cat([z.sin(), z.cos()], dim=-1))


# 2. A tensor created inside forward -------------------------------------------------------------
class TinyRNN(nn.Module):
    """A recurrent net over (batch, time, features); the hidden state starts at zero."""

    input_shape = (16, 4, FEATURES)

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.hidden = hidden
        self.inp = nn.Linear(FEATURES, hidden)
        self.rec = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.hidden)  # BUG: default device (cpu) and dtype (float32)
        for t in range(x.shape[1]):
            h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
        return self.out(h)


class TinyRNNFixed(TinyRNN):
    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden)  # follows the input's device and dtype
        for t in range(x.shape[1]):
            h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
        return self.out(h)


# 3. The source document's module ---------------------------------------------------------------
class SourceModule(nn.Module):
    """The document's `CustomModule`, with the forward it lacks and no device in __init__."""

    input_shape = (16, 10)

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(10, 10)

    def forward(self, x):
        return self.layer(x)


# 4. A module meant to be built on the meta device -----------------------------------------------
class PositionalNet(nn.Module):
    """Adds a fixed positional table (a buffer computed in __init__) before two linear layers.
    `init_weights()` re-initialises everything, buffers included, after `to_empty`."""

    input_shape = (16, FEATURES)

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.lin = nn.Linear(FEATURES, hidden)
        self.head = nn.Linear(hidden, 1)
        self.register_buffer("positions", self.position_table(), persistent=False)

    @staticmethod
    def position_table(device=None) -> torch.Tensor:
        return torch.sin(torch.arange(FEATURES, dtype=torch.float32, device=device) / FEATURES)

    @torch.no_grad()
    def init_weights(self) -> None:
        self.lin.reset_parameters()
        self.head.reset_parameters()
        self.positions.copy_(self.position_table(self.positions.device))

    def forward(self, x):
        return self.head(torch.relu(self.lin(x + self.positions)))


def example_batch(model_cls, rank: int, step: int = 0) -> torch.Tensor:
    """Rank `rank`'s batch at `step`, shaped by `model_cls.input_shape` (different per rank)."""
    shape = getattr(model_cls, "input_shape", (16, FEATURES))
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1000 + 100 * rank + step))
