"""The per-rank code of lesson 10. One training loop (`accumulate_and_step`) runs every scenario;
DDP's gradient all-reduces are counted with a communication hook, and each optimiser step's
gradient is compared with a large-batch reference the rank computes on its own. What changes is
the piece a learner writes: `backward(model, micro_batches)`. Every function here runs on a rank."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import Net


class CommCounter:
    """State of the counting hook: how many all-reduces DDP launched, and of how many bytes."""

    def __init__(self):
        self.calls = 0
        self.bytes = 0


def counting_allreduce_hook(counter: CommCounter, bucket):
    """A DDP communication hook: count the bucket, then all-reduce it as DDP does by default
    (sum, divided by the world size)."""
    buf = bucket.buffer()
    counter.calls += 1
    counter.bytes += buf.numel() * buf.element_size()
    return allreduce_hook(None, bucket)


# --- the piece a learner writes: k backward passes for one optimiser step --------------------

def backward_every_micro_batch(model: DDP, micro_batches) -> None:
    """Accumulation as on one GPU: DDP all-reduces the gradients after every backward."""
    k = len(micro_batches)
    for x, y in micro_batches:
        (F.mse_loss(model(x), y) / k).backward()


def backward_with_no_sync(model: DDP, micro_batches) -> None:
    """The fix: no all-reduce while accumulating (`no_sync`); the last backward, outside it,
    all-reduces the accumulated gradients once."""
    k = len(micro_batches)
    *first, last = micro_batches
    with model.no_sync():
        for x, y in first:
            (F.mse_loss(model(x), y) / k).backward()
    (F.mse_loss(model(last[0]), last[1]) / k).backward()


def backward_no_sync_around_backward_only(model: DDP, micro_batches) -> None:
    """no_sync around the backward calls only: DDP decides in the *forward* whether the next
    backward all-reduces, so every backward still does."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        loss = F.mse_loss(model(x), y) / k
        if i < k - 1:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()


def backward_summing_losses(model: DDP, micro_batches) -> None:
    """no_sync, but each micro-batch's loss is not divided by k: the gradients are summed over
    the micro-batches, k times the large-batch gradient."""
    *first, last = micro_batches
    with model.no_sync():
        for x, y in first:
            F.mse_loss(model(x), y).backward()
    F.mse_loss(model(last[0]), last[1]).backward()


# --- the training loop -----------------------------------------------------------------------

def global_batch(step: int, size: int, dev, seed: int = 0):
    """The same large batch on every rank, so each rank can compute the reference itself."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(size, 8, generator=g)
    return x.to(dev), (x[:, :4] * 2 - x[:, 4:]).to(dev)


def reference_grads(model: nn.Module, x, y) -> list:
    """The gradient of the mean loss over the whole global batch, in one process."""
    ref = copy.deepcopy(model)
    ref.zero_grad()
    F.mse_loss(ref(x), y).backward()
    return [p.grad.detach().clone() for p in ref.parameters()]


def accumulate_and_step(backward=backward_every_micro_batch, k: int = 4, micro_batch: int = 4,
                        steps: int = 3, seed: int = 0) -> dict:
    """`steps` optimiser steps, each over k micro-batches per rank (`backward(model, batches)`).
    Per step: DDP's all-reduces and their bytes, and the gradient's error against the
    large-batch reference."""
    info, dev = rank_info(), device()
    torch.manual_seed(seed)
    model = DDP(Net().to(dev), **ddp_kwargs(dev))
    counter = CommCounter()
    model.register_comm_hook(counter, counting_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    calls, sent, errors = [], [], []
    for step in range(steps):
        x, y = global_batch(step, info.world_size * k * micro_batch, dev, seed)
        ref = reference_grads(model.module, x, y)
        mine = slice(info.rank * k * micro_batch, (info.rank + 1) * k * micro_batch)
        xs, ys = x[mine].split(micro_batch), y[mine].split(micro_batch)
        before = (counter.calls, counter.bytes)
        backward(model, list(zip(xs, ys)))
        calls.append(counter.calls - before[0])
        sent.append(counter.bytes - before[1])
        errors.append(_relative_error([p.grad for p in model.parameters()], ref))
        opt.step()
        opt.zero_grad()
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    return {"allreduces_per_step": calls, "bytes_per_step": sent, "grad_error_per_step": errors,
            "allreduces": max(calls) / 1.0, "grad_error": max(errors), "k": k,
            "params": params.tolist()}


def _relative_error(grads, ref) -> float:
    num = max(float((g - r).abs().max()) for g, r in zip(grads, ref))
    return num / max(float(r.abs().max()) for r in ref)
