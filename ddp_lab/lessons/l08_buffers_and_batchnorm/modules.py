"""The modules of lesson 08: a custom layer with a running-statistics buffer (local and
synchronised), and a small synchronised batch norm written with plain all-reduces."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def distributed() -> bool:
    """True inside a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class AllReduceSum(torch.autograd.Function):
    """Sum a tensor over ranks. Its gradient is summed over ranks too: every rank's loss depends
    on every rank's contribution to the sum."""

    @staticmethod
    def forward(ctx, t):
        t = t.clone()
        dist.all_reduce(t)
        return t

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class RunningCenter(nn.Module):
    """Subtracts a running mean of its inputs. The mean is a buffer, updated in training from
    the batch this rank sees -- and only this rank's batch."""

    def __init__(self, features: int = 4, momentum: float = 0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("batches_seen", torch.zeros((), dtype=torch.long))

    def batch_mean(self, x):
        return x.mean(0)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.running_mean.lerp_(self.batch_mean(x), self.momentum)
                self.batches_seen += 1
        return x - self.running_mean


class SyncedRunningCenter(RunningCenter):
    """The fix: the batch mean is taken over every rank's batch (one all-reduce of the sums and
    the count), so every rank applies the same update to its buffer."""

    def batch_mean(self, x):
        if not distributed():
            return x.mean(0)
        stats = torch.cat([x.sum(0), x.new_tensor([x.shape[0]])])
        dist.all_reduce(stats)
        return stats[:-1] / stats[-1]


class CenteredRegressor(nn.Module):
    """A linear model behind a centring layer (`center_cls`: which one)."""

    def __init__(self, center_cls=RunningCenter, features: int = 4):
        super().__init__()
        self.center = center_cls(features)
        self.linear = nn.Linear(features, 1)

    def forward(self, x):
        return self.linear(self.center(x))


class SyncedNorm1d(nn.Module):
    """Batch norm over the global batch, for CPU (where SyncBatchNorm refuses) or anywhere: the
    per-feature sum, sum of squares and count are all-reduced (with a gradient), then every rank
    normalises with the same mean and variance and updates the same running statistics."""

    def __init__(self, features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))

    def forward(self, x):
        if not self.training:
            mean, var = self.running_mean, self.running_var
        else:
            stats = torch.cat([x.sum(0), (x * x).sum(0), x.new_tensor([x.shape[0]])])
            if distributed():
                stats = AllReduceSum.apply(stats)
            c, n = x.shape[1], stats[-1]
            mean = stats[:c] / n
            var = stats[c:2 * c] / n - mean * mean  # biased: what normalises the batch
            with torch.no_grad():  # unbiased in the running estimate, as BatchNorm does
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var * n / (n - 1), self.momentum)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class NormNet(nn.Module):
    """Linear -> norm (`norm_cls`) -> ReLU -> Linear."""

    def __init__(self, norm_cls=nn.BatchNorm1d, features: int = 4, hidden: int = 8):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.norm = norm_cls(hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.inp(x))))
