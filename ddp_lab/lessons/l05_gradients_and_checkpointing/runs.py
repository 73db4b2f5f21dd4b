"""What runs on each rank in lesson 05: DDP training loops that carry state across steps, edit
saved tensors in place, checkpoint regions with side effects, and measure activation memory.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import named_drift, saved_tensor_bytes
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .runs_memory import held_saved_bytes, memory_mb, peak_growth, slope
from .modules import AttentionPool, ContextNet, DeepMLP, MemoryNet

MB = 2 ** 20


def param_drift(model) -> float:
    """The largest difference of any parameter between ranks (a collective)."""
    return max(named_drift(dict(model.named_parameters())).values())


def _batches(rank: int, features: int, batch: int):
    g = torch.Generator().manual_seed(100 + rank)
    while True:
        yield torch.randn(batch, features, generator=g)


def carry_state(model_cls=ContextNet, steps: int = 30, retain_graph: bool = False,
                features: int = 256, batch: int = 512, lr: float = 0.01) -> dict:
    """DDP training of a module that carries state across steps, a new batch each step.
    After every step: the bytes autograd still holds, and this rank's memory (resident memory
    on the CPU, allocated memory on a GPU)."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(model_cls(features=features).to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = _batches(info.rank, features, batch)
    held_mb, memory = [], []
    with held_saved_bytes() as held:
        for step in range(steps):
            loss = model(next(data).to(dev)).pow(2).mean()
            opt.zero_grad()
            loss.backward(retain_graph=retain_graph)
            opt.step()
            del loss
            held_mb.append(held.bytes / MB)
            memory.append(memory_mb(dev))
            print(f"step {step} done")
    half = steps // 2
    return {"held_mb": held_mb, "memory_mb": memory, "held_growth": slope(held_mb, half),
            "memory_growth": slope(memory, half), "drift": param_drift(model.module)}


def train_steps(model_cls=AttentionPool, steps: int = 3, retain_graph: bool = False,
                detect_anomaly: bool = False, lr: float = 0.05) -> dict:
    """A few plain DDP training steps (new batch each step), optionally with `retain_graph`
    and with autograd's anomaly detection on."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(model_cls().to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = _batches(info.rank, 16, 8)
    with torch.autograd.set_detect_anomaly(detect_anomaly):
        for step in range(steps):
            loss = model(next(data).to(dev)).pow(2).mean()
            opt.zero_grad()
            loss.backward(retain_graph=retain_graph)
            opt.step()
            print(f"step {step} done")
    return {"loss": loss.item(), "drift": param_drift(model.module)}


def checkpoint_grads(model_cls=MemoryNet, steps: int = 3, ddp_options: dict | None = None,
                     lr: float = 0.05) -> dict:
    """Train `model_cls()` (which checkpoints part of itself) beside the same net built with
    `checkpointed=False`, on the same batches and random state; compare their gradients."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    net = model_cls().to(dev)
    ref = model_cls(checkpointed=False).to(dev)
    ref.load_state_dict(net.state_dict())
    model = DDP(net, **ddp_kwargs(dev), **(ddp_options or {}))
    reference = DDP(ref, **ddp_kwargs(dev))
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in (model, reference)]
    data = _batches(info.rank, 16, 8)
    errors = []
    for step in range(steps):
        x = next(data).to(dev)
        for m, opt in zip((model, reference), opts):
            torch.manual_seed(1000 * step + info.rank)  # the same dropout masks for both
            loss = m(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
        errors.append(max(float((p.grad - q.grad).abs().max())
                          for p, q in zip(net.parameters(), ref.parameters())))
        for opt in opts:
            opt.step()
    return {"grad_error": max(errors), "grad_errors": errors, "drift": param_drift(net)}


def activation_memory(checkpointed: bool = False, depth: int = 8, features: int = 64,
                      batch: int = 2048, sweep=(1, 2, 4)) -> dict:
    """One DDP training step of DeepMLP(depth): the bytes saved for backward and the growth of
    this rank's peak memory; then the bytes saved by a forward pass at each depth in `sweep`."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(DeepMLP(depth, features, checkpointed).to(dev), **ddp_kwargs(dev))
    model(torch.randn(8, features, device=dev)).sum().backward()  # warm-up: code, allocator
    model.zero_grad(set_to_none=False)
    x = torch.randn(batch, features, generator=torch.Generator().manual_seed(info.rank)).to(dev)
    with peak_growth(dev) as peak:
        with saved_tensor_bytes() as saved:
            loss = model(x).pow(2).mean()
        loss.backward()
    saved_by_depth = {depth: saved.bytes / MB}
    for d in sweep:
        with saved_tensor_bytes() as s:
            DeepMLP(d, features, checkpointed).to(dev)(x).sum()
        saved_by_depth[d] = s.bytes / MB
    return {"saved_mb": saved.bytes / MB, "peak_growth_mb": peak.mb, "peak_exact": peak.exact,
            "saved_by_depth": dict(sorted(saved_by_depth.items()))}
