"""The custom modules of lesson 04: each looks right in float32 and meets autocast.

Weights stay float32 in every fixed module; autocast chooses the precision of each op.
"""
from __future__ import annotations

import torch
from torch import nn

from ...launching.cuda_init import gpu_count

FEATURES = 16
# custom_fwd / custom_bwd need the device type at definition time: the GPU when there is one,
# counted without initialising CUDA (the fork server imports this module: see cuda_init).
DEVICE_TYPE = "cuda" if gpu_count() else "cpu"


def example_batch(rank: int, batch: int = 8) -> torch.Tensor:
    """A float32 batch of `FEATURES` columns, different on each rank."""
    return torch.randn(batch, FEATURES, generator=torch.Generator().manual_seed(100 + rank))


# --- 1. A custom autograd Function -----------------------------------------------------------

class LinearFunction(torch.autograd.Function):
    """y = x W^T + b with a hand-written backward (PyTorch's "Extending autograd" example)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return grad_out @ weight, grad_out.t() @ x, grad_out.sum(0)


class LinearFunctionFixed(torch.autograd.Function):
    """The same op, declared to autocast: inputs cast to float32, autocast off inside."""

    @staticmethod
    @torch.amp.custom_fwd(device_type=DEVICE_TYPE, cast_inputs=torch.float32)
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    @torch.amp.custom_bwd(device_type=DEVICE_TYPE)
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return grad_out @ weight, grad_out.t() @ x, grad_out.sum(0)


class CustomOpNet(nn.Module):
    """A Linear + Tanh body and a head that calls a custom autograd Function."""

    function = LinearFunction

    def __init__(self, hidden: int = 32, out: int = 4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh())
        self.weight = nn.Parameter(torch.randn(out, hidden) / hidden ** 0.5)
        self.bias = nn.Parameter(torch.zeros(out))

    def forward(self, x):
        return self.function.apply(self.body(x), self.weight, self.bias)


class CustomOpNetFixed(CustomOpNet):
    function = LinearFunctionFixed


# --- 2. Small gradients: float16 underflow ------------------------------------------------------

class Decoder(nn.Module):
    """Decodes a 16-number code into a 512-pixel signal. The output layer starts at zero (as
    residual heads often do), so training starts from a small error and stays there."""

    def __init__(self, code: int = 16, hidden: int = 64, pixels: int = 512):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(code, hidden), nn.Tanh())
        self.out = nn.Linear(hidden, pixels)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, z):
        return self.out(self.body(z))


def decoder_data(rank: int, batch: int = 32, code: int = 16, pixels: int = 512,
                 amplitude: float = 3e-4):
    """(codes, targets) for one rank: targets come from a fixed random 'teacher' whose output
    is about `amplitude` in size; the codes differ per rank."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(code, 64, generator=g) / code ** 0.5
    b = torch.randn(64, pixels, generator=g) / 8 * amplitude
    z = torch.randn(batch, code, generator=torch.Generator().manual_seed(10 + rank))
    return z, torch.tanh(z @ a) @ b


# --- 3. A module that picks its own dtypes -------------------------------------------------------

class CentredFeatures(nn.Module):
    """Centres its features with a running mean kept in a float32 buffer, updated in place."""

    def __init__(self, hidden: int = 32, momentum: float = 0.1):
        super().__init__()
        self.proj = nn.Linear(FEATURES, hidden)
        self.head = nn.Linear(hidden, 4)
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(hidden))

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        if self.training:
            self.running_mean.lerp_(h.detach().mean(0), self.momentum)
        return self.head(h - self.running_mean)


class CentredFeaturesFixed(CentredFeatures):
    """The buffer stays float32: the statistic is cast to it, and it to the activations."""

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        if self.training:
            self.running_mean.lerp_(h.detach().mean(0).to(self.running_mean.dtype), self.momentum)
        return self.head(h - self.running_mean.to(h.dtype))


class HalfWeightNet(nn.Module):
    """An MLP that stores its own weights in bfloat16 "to halve the memory"."""

    def __init__(self, hidden: int = 64, low_precision: bool = True):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 4))
        if low_precision:
            self.to(torch.bfloat16)

    def forward(self, x):
        return self.layers(x)


class FullWeightNet(HalfWeightNet):
    """The rule: weights stay float32; autocast casts each op's inputs to bfloat16."""

    def __init__(self, hidden: int = 64):
        super().__init__(hidden, low_precision=False)
