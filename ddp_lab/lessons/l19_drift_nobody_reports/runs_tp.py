"""Lesson 19's clipping under tensor parallelism, on each rank. `Block` is split over 2 ranks
(`up` colwise, `down` rowwise): `up.weight`, `up.bias` and `down.weight` become DTensors sharded
over the ranks (`Shard`), each rank holding a piece; `down.bias` becomes a DTensor too, but whole
on every rank (`Replicate`: RowwiseParallel adds the bias after the all-reduce,
torch/distributed/tensor/parallel/style.py:266-277); `norm` is not in the plan and stays a plain
Parameter, the same on every rank. Every rank trains on the SAME batch (tensor parallelism
splits the model, not the data), so the replicated gradients are the same everywhere and nothing
but the clipping can make `norm` drift.

`torch.nn.utils.clip_grad_norm_` over these parameters computes the norms of all gradients in
one `torch._foreach_norm` call (torch/nn/utils/clip_grad.py:49-95, `_get_total_norm`), and DTensor
refuses an op that mixes DTensors and plain tensors (torch/distributed/tensor/_dispatch.py:
817-823, "got mixed torch.Tensor and DTensor"), except a plain tensor of one element, or any
plain tensor under `torch.distributed.tensor.experimental.implicit_replication()`, which it takes
as replicated (_dispatch.py:806). An in-place op on a plain tensor with a DTensor operand
(`total += dtensor`) fails with a bare AssertionError (_dispatch.py:530-531): `local(g)` gives
plain tensors to compute with."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ...instruments.probes import named_drift
from ...launching.rankinfo import device, rank_info
from .modules import Block

MAX_NORM, LR = 0.1, 0.5


def local(g) -> torch.Tensor:
    """The plain tensor this rank holds of gradient `g`: a shard's piece, a replicated DTensor's
    whole (`to_local()`), or `g` itself when it is a plain tensor."""
    from torch.distributed.tensor import DTensor

    return g.to_local() if isinstance(g, DTensor) else g


def is_sharded(t) -> bool:
    """Whether `t` is a DTensor split over the ranks (some `Shard` placement): each rank holds
    only a piece. False for a replicated DTensor (`down.bias`) and a plain tensor (`norm`'s)."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(t, DTensor) and any(isinstance(p, Shard) for p in t.placements)


def local_norm(params) -> float:
    """The "fix" that runs: the norm of the gradients this rank holds (its shards and the
    replicated ones), different on every rank."""
    return float(torch.stack([local(p.grad).pow(2).sum() for p in params]).sum().sqrt())


def global_norm(params) -> float:
    """The norm of the whole model's gradient, the same on every rank: the squares of the
    sharded gradients are summed over the ranks (one all_reduce), the replicated ones counted
    once (every rank holds all of them)."""
    sharded = [local(p.grad).pow(2).sum() for p in params if is_sharded(p.grad)]
    whole = [local(p.grad).pow(2).sum() for p in params if not is_sharded(p.grad)]
    total = torch.stack(sharded).sum() if sharded else torch.zeros((), dtype=torch.float64)
    dist.all_reduce(total)
    return float((total + sum(whole)).sqrt())


def whole_norm(params) -> float:
    """The checker's reference, computed another way: every gradient assembled whole on every
    rank (`full_tensor()`, an all-gather for a shard), then one norm."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in params]
    return float(torch.cat([g.flatten() for g in grads]).norm())


def clip(params, norm: float) -> float:
    """Scale every gradient by min(1, MAX_NORM / norm): the clip factor applied."""
    factor = min(1.0, MAX_NORM / (norm + 1e-6))
    for p in params:
        p.grad.mul_(factor)
    return factor


NORMS = {"local": local_norm, "global": global_norm}


def train_clipped(norm="global", steps: int = 5) -> dict:
    """Tensor-parallel training of `Block` on 2 ranks, its gradients clipped: "clip_grad_norm_"
    (PyTorch's, on every parameter), or by the norm `NORMS[norm]` or your own
    `norm(params) -> float` returns, which `clip` then applies. Records, after each step, the
    clip factor, the norm clipped by beside the whole gradient's (`whole_norm`, before
    clipping), and how far `norm`'s replicated parameters are apart."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = DeviceMesh(device().type, list(range(rank_info().world_size)))
    torch.manual_seed(0)
    # float64: the drift and the clip factors the notebook prints are then the same to many
    # digits under any CPU kernel (ATEN_CPU_CAPABILITY); float32 drifts alike
    model = parallelize_module(Block().to(device(), torch.float64), mesh, Block.tp_plan())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    params = list(model.parameters())
    factors, norms, wholes, drifts = [], [], [], []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)  # the same batch on every rank
        x, y = (torch.randn(16, 8, generator=g, dtype=torch.float64) for _ in range(2))
        loss = nn.functional.mse_loss(model(x.to(device())), y.to(device()))
        opt.zero_grad()
        loss.backward()
        wholes.append(whole_norm(params))
        if norm == "clip_grad_norm_":
            torch.nn.utils.clip_grad_norm_(params, MAX_NORM)  # raises: mixed DTensor and Tensor
        norms.append(float((NORMS[norm] if isinstance(norm, str) else norm)(params)))
        factors.append(clip(params, norms[-1]))
        opt.step()
        drifts.append(max(named_drift(dict(model.norm.named_parameters())).values()))
    named = list(model.named_parameters())
    return {"factors": factors, "norms": norms, "whole_norms": wholes, "drift_per_step": drifts,
            "drift": drifts[-1], "kinds": {n: type(p).__name__ for n, p in named},
            "placements": {n: str(p.placements[0]) for n, p in named if hasattr(p, "placements")}}
