"""Lesson 10: gradient accumulation under DDP -- no_sync, the all-reduces it saves, and the loss
scaling that makes k micro-batches equal one large batch.

One training loop (`accumulate_and_step`) runs every scenario. DDP's own gradient all-reduces
are counted with a communication hook (`register_comm_hook`), and each optimiser step's
gradient is compared with a large-batch reference that the rank computes on its own. What
changes is the piece a learner writes: `backward(model, micro_batches)`, which runs the k
forward and backward passes of one optimiser step. Every function here runs on a rank.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ..rankinfo import ddp_kwargs, device, rank_info
from ..registry import Expect, Lesson, Scenario, Variant


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


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



# --- the picture -----------------------------------------------------------------------------

def _bars(ax, series: dict, *, title: str, ylabel: str, log: bool = False) -> None:
    """Grouped bars: one group per optimiser step, one bar per labelled run."""
    from ..plots import BROKEN, FIXED

    colours = [BROKEN, FIXED, "#7f8c8d"]
    width = 0.8 / max(len(series), 1)
    for i, (label, ys) in enumerate(series.items()):
        xs = [step + (i - (len(series) - 1) / 2) * width for step in range(len(ys))]
        bars = ax.bar(xs, ys, width, color=colours[i % len(colours)], label=label)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    steps = max((len(ys) for ys in series.values()), default=0)
    ax.set_xticks(range(steps), [str(s + 1) for s in range(steps)])
    top = max((max(ys) for ys in series.values() if len(ys)), default=1.0)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(top=top * 100)
    else:
        ax.set_ylim(0, top * 1.35)
    ax.set_title(title)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)


def figures(results) -> dict:
    """All-reduces and bytes per optimiser step with and without no_sync; the gradient's error
    against the large-batch reference with summed and averaged micro-batch losses."""
    from matplotlib.ticker import MaxNLocator

    from ..plots import figure

    sync = {w: results["no_sync"][w].ranks[0].value for w in ("broken", "fixed")}
    scale = {w: results["loss_scaling"][w].ranks[0].value for w in ("broken", "fixed")}
    k = sync["broken"]["k"]
    fig, (calls, sent, err) = figure(3, title=f"Gradient accumulation over k={k} micro-batches "
                                              "(rank 0; DDP's all-reduces counted by a comm hook)",
                                     width=4.6)
    runs = {"without no_sync": "broken", "with no_sync": "fixed"}
    _bars(calls, {lab: sync[w]["allreduces_per_step"] for lab, w in runs.items()},
          title="all-reduces per optimiser step", ylabel="all-reduces launched by DDP (count)")
    calls.yaxis.set_major_locator(MaxNLocator(integer=True))
    _bars(sent, {lab: [b / 1024 for b in sync[w]["bytes_per_step"]] for lab, w in runs.items()},
          title="gradient bytes all-reduced per step", ylabel="bucket bytes (KiB)")
    _bars(err, {"losses summed": scale["broken"]["grad_error_per_step"],
                "losses / k": scale["fixed"]["grad_error_per_step"]}, log=True,
          title="gradient vs one large batch", ylabel="max relative error of the gradient")
    return {"allreduces_per_step": fig}


# --- the lesson ------------------------------------------------------------------------------

GRAD_TOLERANCE = 1e-5  # relative; float32 sums in a different order differ by ~1e-7


def _gradients_match(result) -> list[str]:
    return [f"rank {r.rank}: gradient off the large-batch reference by {r.value['grad_error']:.3g} "
            f"(relative), expected < {GRAD_TOLERANCE:g}"
            for r in result.ranks if r.ok and not r.value["grad_error"] < GRAD_TOLERANCE]


def _synchronised(result) -> list[str]:
    problems = _gradients_match(result)
    return problems + [f"rank {r.rank}: a step with no all-reduce: the ranks' gradients were "
                       "never averaged" for r in result.ranks
                       if r.ok and min(r.value["allreduces_per_step"]) < 1]


K = 4

LESSON = Lesson(
    id="10",
    error_class="gradient accumulation",
    title="Gradient accumulation and no_sync",
    notebook="10_gradient_accumulation",
    figures=figures,
    scenarios=[
        Scenario("no_sync", "Accumulating gradients without no_sync",
                 broken=Variant(accumulate_and_step, Expect("ok", metric="allreduces", above=K - 0.5,
                                                            extra=_gradients_match),
                                kwargs={"k": K}),
                 fixed=Variant(accumulate_and_step, Expect("ok", metric="allreduces", below=1.5,
                                                           extra=_synchronised),
                               kwargs={"k": K, "backward": backward_with_no_sync}),
                 summary=f"every backward all-reduces: {K} all-reduces per step for {K} "
                         "micro-batches; `with model.no_sync():` on all but the last makes it one"),
        Scenario("loss_scaling", "Micro-batch losses summed instead of averaged",
                 broken=Variant(accumulate_and_step, Expect("ok", metric="grad_error", above=0.5),
                                kwargs={"k": K, "backward": backward_summing_losses}),
                 fixed=Variant(accumulate_and_step, Expect("ok", metric="grad_error",
                                                           below=GRAD_TOLERANCE),
                               kwargs={"k": K, "backward": backward_with_no_sync}),
                 summary=f"without loss / k the accumulated gradient is {K}x the large-batch "
                         "gradient; divide each micro-batch's loss by k"),
    ],
)
