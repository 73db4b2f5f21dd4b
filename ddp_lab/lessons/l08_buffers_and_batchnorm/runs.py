"""What runs on each rank in lesson 08 (through `ddp_lab.launch`), and the single-process
references the runs are measured against."""
from __future__ import annotations

import inspect
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import module_drift, named_drift, tensor_drift
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import CenteredRegressor, NormNet, RunningCenter

BATCH, FEATURES = 4, 4


def buffer_sync_kwargs(sync: bool) -> dict:
    """DDP's switch for syncing buffers at each forward: `forward_sync_buffers` from torch 2.13,
    the older (now deprecated) `broadcast_buffers` before it."""
    params = inspect.signature(DDP.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": sync}


def shard_batch(rank: int, step: int):
    """Rank `rank`'s batch at `step`: 4 samples whose features have mean `rank` -- each rank
    reads a shard from a different source (another file, sensor or site)."""
    g = torch.Generator().manual_seed(1000 + 100 * rank + step)
    x = torch.randn(BATCH, FEATURES, generator=g) + float(rank)
    return x, x.sum(1, keepdim=True)


def global_batch(world_size: int, step: int):
    """Every rank's batch at `step`, concatenated: what one process with the whole batch sees."""
    parts = [shard_batch(r, step) for r in range(world_size)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def example_input(rank: int):
    """The batch the doctor feeds each rank's module."""
    return shard_batch(rank, 0)[0]


def reference_running_mean(world_size: int, steps: int, momentum: float = 0.1) -> list[list[float]]:
    """The running mean one process would keep over the global batches, after each step."""
    mean, out = torch.zeros(FEATURES), []
    for s in range(steps):
        mean.lerp_(global_batch(world_size, s)[0].mean(0), momentum)
        out.append(mean.tolist())
    return out


def train_stats(center_cls=RunningCenter, steps: int = 20, sync_buffers: bool = True) -> dict:
    """DDP training of `CenteredRegressor(center_cls)` on this rank's shard. Returns the centring
    buffer after each step, the drift between ranks, and the bias of rank's buffer against the
    running mean of all the data."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = CenteredRegressor(center_cls, FEATURES).to(dev)
    ddp = DDP(model, **buffer_sync_kwargs(sync_buffers), **ddp_kwargs(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    history = []
    for step in range(steps):
        x, y = (t.to(dev) for t in shard_batch(info.rank, step))
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(model.center.running_mean.tolist())
    reference = reference_running_mean(info.world_size, steps)
    bias = (model.center.running_mean.cpu() - torch.tensor(reference[-1])).abs().max()
    drifts = named_drift({**dict(model.named_parameters()), **dict(model.named_buffers())})
    return {"history": history, "reference": reference, "bias": float(bias),
            "batches_seen": int(model.center.batches_seen), "drifts": drifts,
            "drift": max(drifts.values())}


def wrap_with(flag: str = "forward_sync_buffers") -> dict:
    """Wrap a module whose buffer each rank filled differently in DDP with `flag`=False; record
    the warnings DDP gives and how far the buffer differs between ranks right after wrapping."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = CenteredRegressor().to(dev)
    model.center.running_mean.fill_(float(info.rank))  # rank-local state, before DDP
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DDP(model, **{flag: False}, **ddp_kwargs(dev))
    return {"warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
            "init_drift": tensor_drift(model.center.running_mean)}


def train_norm(norm_cls=nn.BatchNorm1d, steps: int = 6, convert_sync_bn: bool = False,
               lr: float = 0.1) -> dict:
    """DDP training of `NormNet(norm_cls)`, each rank on its own shard (4 samples), beside a
    single-process reference: the same NormNet with plain BatchNorm1d trained on the global batch.
    `gap` is the largest difference between this rank's parameters or running statistics and the
    reference's; data-parallel training should give the same model as one big batch."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = NormNet(norm_cls).to(dev)
    torch.manual_seed(0)
    reference = NormNet(nn.BatchNorm1d).to(dev)
    if convert_sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = DDP(model, **ddp_kwargs(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    history = []
    for step in range(steps):
        x, y = (t.to(dev) for t in shard_batch(info.rank, step))
        _sgd_step(opt, nn.functional.mse_loss(ddp(x), y))
        gx, gy = (t.to(dev) for t in global_batch(info.world_size, step))
        _sgd_step(ref_opt, nn.functional.mse_loss(reference(gx), gy))
        history.append((model.norm.running_mean[0].item(), reference.norm.running_mean[0].item()))
    mine = {**dict(model.named_parameters()), "norm.running_mean": model.norm.running_mean,
            "norm.running_var": model.norm.running_var}
    ref = {**dict(reference.named_parameters()), "norm.running_mean": reference.norm.running_mean,
           "norm.running_var": reference.norm.running_var}
    gaps = {k: float((mine[k].detach() - ref[k].detach()).abs().max()) for k in ref}
    return {"gap": max(gaps.values()), "gaps": gaps, "history": history,
            "drift": module_drift(model)}


def _sgd_step(opt, loss) -> None:
    opt.zero_grad()
    loss.backward()
    opt.step()


def train_norm_on_cpu(**kwargs) -> dict:
    """`train_norm` in a gloo group on the CPU, on any machine: this rank sets up its own group,
    so the scenario says the same on a GPU node."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    try:
        return train_norm(**kwargs)
    finally:
        dist.destroy_process_group()
