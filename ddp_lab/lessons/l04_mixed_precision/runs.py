"""What runs on each rank in lesson 04: DDP training steps under autocast, with and without a
gradient scaler, with the deprecated `torch.cuda.amp` API, and under ZeroRedundancyOptimizer.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import io
import warnings

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import gather, named_drift
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import CustomOpNet, CustomOpNetFixed, Decoder, HalfWeightNet, decoder_data, example_batch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(dev, precision: str):
    """`torch.autocast` for `precision` ("fp32" turns it off), on the rank's device type."""
    dtype = DTYPES[precision]
    return torch.autocast(device_type=dev.type, dtype=dtype, enabled=dtype != torch.float32)


def train_autocast(model_cls=CustomOpNet, precision: str = "bf16", steps: int = 3,
                   lr: float = 0.05, seed: int = 0) -> dict:
    """A few DDP steps of `model_cls()` with the forward under autocast."""
    info, dev = rank_info(), device()
    torch.manual_seed(seed)
    model = DDP(model_cls().to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = example_batch(info.rank).to(dev)
    losses = []
    for _ in range(steps):
        with autocast(dev, precision):
            out = model(x)
        loss = out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "out_dtype": str(out.dtype), "drift": param_drift(model.module)}


def param_drift(model) -> float:
    """The largest difference of any parameter between ranks (buffers are lesson 08's)."""
    return max(named_drift(dict(model.named_parameters())).values())


def _zero_fraction(params) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    return sum(int((g == 0).sum()) for g in grads) / sum(g.numel() for g in grads)


def _grad_norm(params) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params])))


def fit_decoder(precision: str = "fp16", scaler: bool = False, steps: int = 60, lr: float = 1e-4,
                scaler_options: dict | None = None, clip: float | None = None) -> dict:
    """Train the Decoder with DDP under `precision`, optionally with a GradScaler and gradient
    clipping (after `unscale_`). Records loss, fraction of gradient elements that are exactly
    zero, the scale, and the gradient norm before and after unscaling, at every step."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(Decoder().to(dev), **ddp_kwargs(dev))
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    grad_scaler = torch.amp.GradScaler(dev.type, enabled=scaler, **(scaler_options or {}))
    z, y = (t.to(dev) for t in decoder_data(info.rank))
    log = {k: [] for k in ("loss", "zero_fraction", "scale", "scaled_norm", "norm", "skipped")}
    for _ in range(steps):
        with autocast(dev, precision):
            out = model(z)
        loss = (out.float() - y).pow(2).mean()
        opt.zero_grad()
        grad_scaler.scale(loss).backward()
        scale = grad_scaler.get_scale() if scaler else 1.0
        log["zero_fraction"].append(_zero_fraction(params))
        log["scaled_norm"].append(_grad_norm(params))
        grad_scaler.unscale_(opt)  # from here on, the gradients are the true ones
        log["norm"].append(_grad_norm(params))
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        grad_scaler.step(opt)  # skipped when a gradient is inf or NaN
        grad_scaler.update()
        log["skipped"].append(scaler and grad_scaler.get_scale() < scale)
        log["scale"].append(scale)
        log["loss"].append(loss.item())
    tail = log["zero_fraction"][-10:]
    return {"precision": precision, "scaler": scaler, **log, "zero_grad_fraction": sum(tail) / len(tail),
            "final_loss": sum(log["loss"][-5:]) / 5, "skipped_steps": sum(log["skipped"])}


def compare_precisions(runs=(("fp32", False), ("bf16", False), ("fp16", False)), **kwargs) -> dict:
    """`fit_decoder` once per (precision, scaler) in `runs`, in this rank, on the same data.
    The last run's measurements are the result's own; every run is kept under "runs"."""
    results = {}
    for precision, scaler in runs:
        results[precision + (" + GradScaler" if scaler else "")] = fit_decoder(precision, scaler, **kwargs)
    last = list(results.values())[-1]
    return {**last, "runs": results}


def train_half_weights(model_cls=HalfWeightNet, steps: int = 20, lr: float = 0.01,
                       evaluate: bool = True) -> dict:
    """DDP training under bfloat16 autocast; then (if `evaluate`) a float32 evaluation with
    autocast off, as a validation loop would run it. Measures the fraction of weight elements
    that never changed."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(model_cls().to(dev), **ddp_kwargs(dev))
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = example_batch(info.rank, batch=32).to(dev)
    target = x[:, :4].sin()
    for _ in range(steps):
        with autocast(dev, "bf16"):
            loss = (model(x).float() - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    same = sum(int((p.detach() == s).sum()) for p, s in zip(model.parameters(), start))
    frozen = same / sum(s.numel() for s in start)
    result = {"frozen_fraction": frozen, "weight_dtype": str(start[0].dtype), "loss": loss.item()}
    if evaluate:
        model.eval()
        with torch.no_grad():
            result["eval_loss"] = (model(x) - target).pow(2).mean().item()
    return result


def amp_api_step(api: str = "torch.cuda.amp", steps: int = 3) -> dict:
    """float16 training steps written with `api` ("torch.cuda.amp", as the source document
    does, or "torch.amp"); every warning raised is recorded and returned."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(Decoder().to(dev), **ddp_kwargs(dev))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    z, y = (t.to(dev) for t in decoder_data(info.rank))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if api == "torch.cuda.amp":  # as the source document writes it
            scaler = torch.cuda.amp.GradScaler()
            context = torch.cuda.amp.autocast
        else:
            scaler = torch.amp.GradScaler(dev.type)
            context = lambda: torch.autocast(dev.type, dtype=torch.float16)  # noqa: E731
        for _ in range(steps):
            with context():
                out = model(z)
            loss = (out.float() - y).pow(2).mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    seen = list(dict.fromkeys((w.category.__name__, str(w.message)) for w in caught))
    return {"warnings": seen, "future_warnings": sum(c == "FutureWarning" for c, _ in seen),
            "out_dtype": str(out.dtype), "scaler_enabled": scaler.is_enabled()}


def _state_bytes(optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if torch.is_tensor(t))


def zero_checkpoint(model_cls=CustomOpNetFixed, consolidate: bool = False, steps: int = 3) -> dict:
    """DDP + ZeroRedundancyOptimizer(Adam) under bfloat16 autocast: each rank keeps the Adam
    state of its own shard of the parameters. Then rank 0 serialises the optimizer state, as a
    checkpoint would (after `consolidate_state_dict(to=0)` on every rank, if `consolidate`)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(model_cls().to(dev), **ddp_kwargs(dev))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    x = example_batch(info.rank).to(dev)
    for _ in range(steps):
        with autocast(dev, "bf16"):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    shards, drift = gather(_state_bytes(opt.optim)), param_drift(model.module)
    if consolidate:
        opt.consolidate_state_dict(to=0)  # a collective: every rank sends its shard to rank 0
    saved = 0
    if info.is_main:
        buffer = io.BytesIO()
        torch.save(opt.state_dict(), buffer)
        saved = buffer.tell()
    return {"shard_bytes": shards, "shard_fraction": shards[info.rank] / sum(shards),
            "checkpoint_bytes": saved, "drift": drift}
