"""The per-rank code of lesson 18's collective scenarios: collectives a loop makes without asking
(a logging all_reduce every step, `find_unused_parameters=True` on a graph that uses every
parameter), and DDP's buckets for a module of many small parameters. Each step is marked with
`measured_step()`: the flight recorder's collectives fall into steps (`RankResult.steps`,
`RankResult.collectives_per_step()`). Every function here runs on a rank."""
from __future__ import annotations

import ctypes
import gc
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import current_rss_mb, measured_step, world_seq
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import WIDTH, FeatureGains, Net


def train_logged(log_every: int = 1, ddp_options: dict | None = None, steps: int = 8) -> dict:
    """DDP training that logs the loss averaged over ranks every `log_every` steps, with
    `ddp_options` passed to DistributedDataParallel."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(Net().to(dev), **ddp_kwargs(dev), **(ddp_options or {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    logged = []
    for step in range(steps):
        with measured_step():
            g = torch.Generator().manual_seed(100 * step + info.rank)
            x = torch.randn(64, WIDTH, generator=g).to(dev)
            loss = F.mse_loss(model(x), x[:, :1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if (step + 1) % log_every == 0:
                mean = loss.detach().clone()
                dist.all_reduce(mean)  # the loss over every rank, for the log
                logged.append(mean.item() / info.world_size)
    return {"logged": logged}


def time_logged(rounds: int = 21, block: int = 8, log_every: int = 4) -> dict:
    """What the unasked collectives cost a step, measured in ONE run: the broken loop (the loss
    all-reduced for the log every step, `find_unused_parameters=True`) and the fixed one (logged
    every `log_every` steps, DDP's defaults), two DDP models of the same Net, timed in
    alternating blocks of `block` steps after one untimed block each; both ranks switch together
    (a barrier). Returns each loop's median seconds per step over `rounds` blocks, their ratio,
    and the world group's collectives per block of each (the flight recorder's count). Shorter
    blocks measured too little: 7 blocks of 4 steps gave 0.93 to 1.53 at load 2-3, 21 of 8 gave
    1.54 to 1.72."""
    info, dev = rank_info(), device()
    loops = {}
    for name, options in (("broken", {"find_unused_parameters": True}), ("fixed", {})):
        torch.manual_seed(0)
        model = DDP(Net().to(dev), **ddp_kwargs(dev), **options)
        loops[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01), 1 if name == "broken" else log_every)
    x = torch.randn(64, WIDTH, generator=torch.Generator().manual_seed(info.rank)).to(dev)
    seconds, collectives = {k: [] for k in loops}, {k: [] for k in loops}
    for r in range(rounds + 1):
        for name, (model, opt, log_every) in loops.items():
            dist.barrier()
            seq, start = world_seq(), time.perf_counter()
            for step in range(block):
                loss = F.mse_loss(model(x), x[:, :1])
                opt.zero_grad()
                loss.backward()
                opt.step()
                if (step + 1) % log_every == 0:
                    mean = loss.detach().clone()
                    dist.all_reduce(mean)
                    mean.item()
            if r:  # the first round warms both up (DDP rebuilds its buckets at its second step)
                seconds[name].append((time.perf_counter() - start) / block)
                if seq is not None:
                    collectives[name].append(world_seq() - seq)
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    return {"broken_s": medians["broken"], "fixed_s": medians["fixed"],
            "ratio": medians["broken"] / medians["fixed"],
            "collectives_per_block": {k: sorted(set(v)) for k, v in collectives.items()}}


def settled_rss_mb() -> float:
    """Resident memory once freed memory is given back: a garbage collection, then glibc's
    malloc_trim (Linux; elsewhere the collection only)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return current_rss_mb()


def train_gains(ddp_options: dict | None = None, steps: int = 4) -> dict:
    """DDP training of FeatureGains (256 parameters of 64 KiB) with `ddp_options`. Returns
    how DDP bucketed the gradients, in how many separate storages the gradients live, and the
    memory the rank holds after training above what it held before building the model."""
    dev = device()
    torch.manual_seed(0)
    before = settled_rss_mb()
    module = FeatureGains().to(dev)
    model = DDP(module, **ddp_kwargs(dev), **(ddp_options or {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, module.gains[0].numel(), device=dev)
    for _ in range(steps):
        with measured_step():
            opt.zero_grad()
            model(x).backward()
            opt.step()
    logged = model._get_ddp_logging_data()  # DDP's own record of its buckets (a private API)
    sizes = logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or ""
    storages = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                for p in module.parameters()}
    held_mb = settled_rss_mb() - before
    return {"bucket_bytes": [int(s) for s in str(sizes).split(",") if s.strip()],
            "held_mb": held_mb,
            "grad_storages": len(storages), "grad_storage_bytes": sum(storages.values()),
            "param_bytes": sum(p.numel() * p.element_size() for p in module.parameters()),
            "gradient_as_bucket_view": bool(logged.get("gradient_as_bucket_view"))}
