"""Scenario 4: loading before or after DDP wraps the model. Runs on a rank."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import named_drift
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import Net
from .runs import compare_with_checkpoint, fingerprint, shared_tmpdir, train
from .runs_writers import save_on_rank0


def resume_rank0_after_wrap(path: str, dev) -> DDP:
    """Wrap first, then rank 0 alone loads: DDP's one broadcast of rank 0's weights is over."""
    model = DDP(Net().to(dev), **ddp_kwargs(dev))
    if rank_info().is_main:
        model.module.load_state_dict(torch.load(path, map_location=dev))
    return model


def resume_rank0_before_wrap(path: str, dev) -> DDP:
    """The fix: load before wrapping. DDP's constructor broadcasts rank 0's parameters and
    buffers, so the other ranks receive the checkpoint from it."""
    net = Net().to(dev)
    if rank_info().is_main:
        net.load_state_dict(torch.load(path, map_location=dev))
    return DDP(net, **ddp_kwargs(dev))


def resume_every_rank_after_wrap(path: str, dev) -> DDP:
    model = DDP(Net().to(dev), **ddp_kwargs(dev))
    model.module.load_state_dict(torch.load(path, map_location=dev))
    return model


def resume_every_rank_before_wrap(path: str, dev) -> DDP:
    net = Net().to(dev)
    net.load_state_dict(torch.load(path, map_location=dev))
    return DDP(net, **ddp_kwargs(dev))


def resume_and_train(resume=resume_rank0_after_wrap, steps: int = 3,
                     ckpt_dir: str | None = None) -> dict:
    """Rank 0 saves a trained model; then, as a restarted job does, every rank builds a fresh
    model (same seed), `resume(path, dev)`s it and trains `steps` more steps."""
    dev = device()
    trained = train(dev)
    with shared_tmpdir(ckpt_dir) as d:
        path = os.path.join(d, "checkpoint.pt")
        save_on_rank0(trained, path)
        dist.barrier()
        torch.manual_seed(0)  # the restarted job's seed: the same initial weights as before
        initial = fingerprint(Net().state_dict())
        torch.manual_seed(0)
        model = resume(path, dev)
    held = compare_with_checkpoint(trained, model.module.state_dict())
    if not held["is_checkpoint"]:
        fresh = fingerprint(model.module.state_dict()) == initial
        held["holds"] = "initial weights" if fresh else "other"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank_info().rank)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g).to(dev)
        loss = F.mse_loss(model(x), torch.zeros(16, 4, device=dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
    drift = max(named_drift(dict(model.module.named_parameters())).values())
    return {**held, "drift": drift}
