"""What runs on each rank in lesson 02: cast a module and train it, measure which of its tensors
the ranks disagree on, wrap it for its device, and materialise it from the meta device.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import tensor_drift
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from ...instruments.modwalk import find_tensors, table
from .modules import PositionalNet, RandomFeatures, SourceModule, example_batch


def _step(net, opt, model_cls, rank: int, step: int, dev, dtype=None) -> float:
    x = example_batch(model_cls, rank, step).to(dev, dtype)
    loss = net(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def train_cast(model_cls=RandomFeatures, dtype: str = "float64", steps: int = 3,
               seed: int = 0) -> dict:
    """Build the module, cast it with `.to(device, dtype)` as a whole, wrap it in DDP and train
    it on batches of that dtype."""
    info, dev, dt = rank_info(), device(), getattr(torch, dtype)
    torch.manual_seed(seed + info.rank)
    model = model_cls().to(dev, dt)
    net = DDP(model, **ddp_kwargs(dev))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    losses = [_step(net, opt, model_cls, info.rank, s, dev, dt) for s in range(steps)]
    return {"losses": losses, "tensors": table(model), "state_dict": sorted(model.state_dict())}


def _drifts(model, dev) -> dict[str, float]:
    """Every tensor's max |t_rank - t_rank0|, registered or not (a collective)."""
    return {n: tensor_drift(h.tensor.detach().to(dev)) for n, h in find_tensors(model).items()}


def tensor_map(model) -> list[dict]:
    """One row per tensor: how it is held, its device, and its dtype after `.double()`."""
    cast = {row["name"]: row["dtype"] for row in table(copy.deepcopy(model).double())}
    return [dict(row, dtype_after_double=cast[row["name"]]) for row in table(model)]


def constants_across_ranks(model_cls=RandomFeatures, steps: int = 4, seed: int = 0) -> dict:
    """Each rank builds its own copy (seeded by rank), moves it to its device, wraps it in DDP and
    trains it. Measured every step: each tensor's drift between ranks, and how far the ranks'
    outputs for the same probe batch are apart."""
    info, dev = rank_info(), device()
    torch.manual_seed(seed + info.rank)
    model = model_cls().to(dev)
    rows = tensor_map(model)
    net = DDP(model, **ddp_kwargs(dev))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    probe = example_batch(model_cls, rank=99).to(dev)
    per_step, gaps = [], []
    for step in range(steps + 1):
        if step:
            _step(net, opt, model_cls, info.rank, step, dev)
        per_step.append(_drifts(model, dev))
        with torch.no_grad():
            gaps.append(tensor_drift(model(probe)))
    final = per_step[-1]
    return {"drift": max(final.values()), "tensor_drift_per_step": {n: [d[n] for d in per_step]
                                                                   for n in final},
            "output_gap_per_step": gaps, "map": [dict(r, drift=final[r["name"]]) for r in rows],
            "state_dict": sorted(model.state_dict())}


def wrap_for_device(pattern: str = "source", steps: int = 2) -> dict:
    """"source": the document's call, `DDP(model, device_ids=[rank])`, on a module built on the
    CPU. "agnostic": one helper picks the device, the module moves once, device_ids only on CUDA."""
    info = rank_info()
    torch.manual_seed(info.rank)
    model = SourceModule()
    if pattern == "source":
        dev = torch.device("cpu")
        net = DDP(model, device_ids=[info.local_rank])
    else:
        dev = device()
        net = DDP(model.to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    losses = [_step(net, opt, SourceModule, info.rank, s, dev) for s in range(steps)]
    drift = max(tensor_drift(p.detach()) for p in model.parameters())
    return {"device": str(dev), "losses": losses, "drift": drift}


def hardcoded_cuda() -> dict:
    """The document's line as written: build the layer straight onto `cuda:{rank}`."""
    rank = rank_info().rank
    layer = nn.Linear(10, 10).to(f"cuda:{rank}")
    return {"device": str(layer.weight.device)}


def materialise(model_cls=PositionalNet, how: str = "init", steps: int = 3) -> dict:
    """Build on the meta device (no memory), then materialise on this rank's device:
    "to": `.to(device)`; "to_empty": `to_empty` alone; "reset_parameters": `to_empty`, then
    `reset_parameters()` of every sub-module that has one (the common recipe); "init":
    `to_empty`, then the module's own `init_weights()`. Deterministic mode makes PyTorch fill
    memory it hands out uninitialised with NaN, so a forgotten initialisation shows every time.
    `nonfinite` names the tensors still NaN once materialised, before any training."""
    info, dev = rank_info(), device()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(info.rank)
    with torch.device("meta"):
        model = model_cls()
    built_on = sorted({str(h.tensor.device) for h in find_tensors(model).values()})
    if how == "to":
        model = model.to(dev)
    else:
        model = model.to_empty(device=dev)
    if how == "reset_parameters":
        for sub in model.modules():
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()
    elif how == "init":
        model.init_weights()
    bad = [n for n, h in find_tensors(model).items() if not torch.isfinite(h.tensor).all()]
    net = DDP(model, **ddp_kwargs(dev))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    losses = [_step(net, opt, model_cls, info.rank, s, dev) for s in range(steps)]
    return {"losses": losses, "nonfinite": bad, "nonfinite_tensors": len(bad),
            "built_on": built_on,
            "devices": sorted({str(h.tensor.device) for h in find_tensors(model).values()})}
