"""What runs on each rank in lesson 01: a training loop that measures how far the ranks' copies
of every trainable tensor (registered or not) drift apart, and two measurements of wrappers.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import os
import statistics
import threading
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import tensor_drift
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from ...instruments.modwalk import trainable, unregistered
from .modules import AuxHeadNet, AuxHeadNetFixed, FEATURES, GainNet, example_batch


def wrap(model: nn.Module, wrapper: str, dev, ddp_options: dict | None = None) -> nn.Module:
    """"ddp": DistributedDataParallel; "dp": DataParallel (this process's GPU, if any); "none"."""
    if wrapper == "ddp":
        return DDP(model, **ddp_kwargs(dev), **(ddp_options or {}))
    if wrapper == "dp":
        return nn.DataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if wrapper == "none":
        return model
    raise ValueError(f"unknown wrapper {wrapper!r}: use 'ddp', 'dp' or 'none'")


def drifts(tensors: dict, dev) -> dict[str, float]:
    """max |t_rank - t_rank0| of each tensor (a collective: call it on every rank)."""
    return {name: tensor_drift(t.detach().to(dev)) for name, t in tensors.items()}


def train(model_cls=GainNet, steps: int = 6, seed: int = 0, lr: float = 0.05,
          wrapper: str = "ddp", ddp_options: dict | None = None) -> dict:
    """Each rank builds its own copy (seeded by rank, as real initialisation is), wraps it, and
    trains it with SGD over `parameters()` on its own batches. Measured after every step: how far
    the ranks' copies of each trainable tensor (registered or not) are apart; at the end, how far
    each tensor moved on this rank."""
    info, dev = rank_info(), device()
    torch.manual_seed(seed + info.rank)
    model = model_cls().to(dev)
    tensors = trainable(model)
    start = {name: t.detach().clone() for name, t in tensors.items()}
    net = wrap(model, wrapper, dev, ddp_options)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    per_step = [drifts(tensors, dev)]
    for step in range(steps):
        x = example_batch(info.rank * 100 + step).to(dev)
        loss = (net(x) - torch.sin(x).sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        per_step.append(drifts(tensors, dev))
        print(f"step {step} done")
    drift_per_step = [max(d.values(), default=0.0) for d in per_step]
    return {"drift": drift_per_step[-1], "drift_per_step": drift_per_step,
            "tensor_drift_per_step": {n: [d[n] for d in per_step] for n in tensors},
            "moved": {n: float((t.detach() - start[n]).abs().max()) for n, t in tensors.items()},
            "unregistered": unregistered(model),
            "registered": [n for n, _ in model.named_parameters()]}


def who_runs_forward(wrapper: str = "dp") -> dict:
    """One training step; a forward hook records which process and thread ran the module."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 4), nn.ReLU(), nn.Linear(4, 1)).to(dev)
    calls = []
    model.register_forward_hook(lambda m, args, out: calls.append(
        {"thread": threading.current_thread().name, "device": str(args[0].device)}))
    net = wrap(model, wrapper, dev)
    net(example_batch(info.rank).to(dev)).sum().backward()
    return {"rank": info.rank, "pid": os.getpid(), "wrapper": type(net).__name__,
            "device_ids": list(getattr(net, "device_ids", None) or []), "calls": calls}


def find_unused_cost(steps: int = 40, warmup: int = 5, hidden: int = 16) -> dict:
    """Median time of one forward+backward step, in ms, of four DDP models interleaved step by
    step in one run (so load on the machine hits them alike): the fixed module; the broken
    module with find_unused_parameters=True and with static_graph=True; the fixed module with
    find_unused_parameters=True (nothing to find). Ratios: the median over rounds of each model's
    step time over the fixed module's step time in the same round."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    models = {
        "fixed module": DDP(AuxHeadNetFixed(hidden).to(dev), **ddp_kwargs(dev)),
        "find_unused_parameters=True": DDP(AuxHeadNet(hidden).to(dev), **ddp_kwargs(dev),
                                           find_unused_parameters=True),
        "static_graph=True": DDP(AuxHeadNet(hidden).to(dev), **ddp_kwargs(dev), static_graph=True),
        "fixed module, find_unused_parameters=True": DDP(
            AuxHeadNetFixed(hidden).to(dev), **ddp_kwargs(dev), find_unused_parameters=True),
    }
    times = {name: [] for name in models}
    x = example_batch(info.rank).to(dev)
    for _ in range(warmup + steps):
        for name, net in models.items():
            start = time.perf_counter()
            net(x).sum().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times[name].append(time.perf_counter() - start)
    base = times["fixed module"][warmup:]
    ms = {name: 1e3 * statistics.median(t[warmup:]) for name, t in times.items()}
    # each step's time over the fixed module's in the same round, then the median of those
    ratio = {name: statistics.median(a / b for a, b in zip(t[warmup:], base))
             for name, t in times.items()}
    return {"ms": ms, "ratio": ratio, "find_unused_ratio": ratio["find_unused_parameters=True"]}
