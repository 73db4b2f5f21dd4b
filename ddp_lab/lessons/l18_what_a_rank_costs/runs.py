"""The per-rank code of lesson 18's memory scenarios: a loss history that holds its graphs, and
a metric gathered to rank 0. Each step is marked with `measured_step()`, so the launcher brings
back every rank's memory step by step (`RankResult.steps`). Every function here runs on a rank."""
from __future__ import annotations

import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import measured_step
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import WIDTH, Net

HELD_OUT = 8192  # rows of the held-out batch whose loss the loop logs every step


# --- what a rank holds: tensors the garbage collector sees, and the autograd graph behind them

def live_tensors() -> list:
    """Every tensor object alive in this process (the garbage collector's view). `type()`, not
    `isinstance`: the latter reads `__class__`, which some deprecated torch objects warn on."""
    return [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]


def graph_nodes(tensors=None) -> int:
    """The autograd nodes reachable from `tensors` (default: every live tensor): the graph that
    something still holds. A graph that was never run backward also holds its saved
    activations."""
    todo = [t.grad_fn for t in (live_tensors() if tensors is None else tensors)
            if t.grad_fn is not None]
    seen = {}
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen[id(node)] = node  # kept alive while counting, so ids stay unique
            todo.extend(fn for fn, _ in node.next_functions)
    return len(seen)


def new_saved_bytes(fn, existing) -> int:
    """The bytes of the tensors autograd saves for backward while `fn()` runs, counting each
    storage once and none of `existing` (parameters, inputs): what holding the graph adds."""
    known = {t.untyped_storage().data_ptr() for t in existing}
    new = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in known:
            new[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(new.values())


# --- scenario 1: a history that holds the graph --------------------------------------------------

def batch(step: int, rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed * 10_000 + step)
    x = torch.randn(rows, WIDTH, generator=g)
    return x, x[:, :1] * 2


def train_with_history(keep_tensors: bool = True, steps: int = 12) -> dict:
    """DDP training that logs, every step, its training loss and the loss on a held-out batch.
    `keep_tensors=True` appends the loss tensors to the history (the bug); False appends
    `loss.item()`, a Python float. Per step: live tensors and autograd nodes."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = DDP(Net().to(dev), **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    held_x, held_y = (t.to(dev) for t in batch(-1, HELD_OUT))
    train_log, held_out_log, tensors, nodes = [], [], [], []
    for step in range(steps):
        with measured_step():
            x, y = (t.to(dev) for t in batch(step, 64, seed=info.rank))
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            held_out = F.mse_loss(model(held_x), held_y)  # logged only: never run backward
            if keep_tensors:
                train_log.append(loss)
                held_out_log.append(held_out)
            else:
                train_log.append(loss.item())
                held_out_log.append(held_out.item())
            del loss, held_out
        alive = live_tensors()
        tensors.append(len(alive))
        nodes.append(graph_nodes(alive))
        del alive
    held = new_saved_bytes(lambda: model(held_x), [held_x, *model.parameters()])
    return {"live_tensors": tensors, "graph_nodes": nodes,
            "nodes_per_step": (nodes[-1] - nodes[1]) / (steps - 2),
            "tensors_per_step": (tensors[-1] - tensors[1]) / (steps - 2),
            "held_out_graph_mb": held / 2 ** 20}


# --- scenario 2: rank 0 gathers everything -----------------------------------------------------

def evaluate_metric(gather: bool = True, steps: int = 3, mb: int = 16) -> dict:
    """Every step, each rank predicts `mb` MiB of float32 values for its shard and the loop
    logs the mean squared error over all ranks. `gather=True`: rank 0 gathers every rank's
    predictions and targets and computes it (the bug); False: each rank reduces its shard to
    a sum and a count, and one all_reduce of two numbers combines them."""
    info = rank_info()
    numel = mb * 2 ** 18
    errors = []
    for step in range(steps):
        with measured_step():
            g = torch.Generator().manual_seed(1000 * step + info.rank)
            preds, targets = torch.randn(numel, generator=g), torch.randn(numel, generator=g)
            if gather:
                errors.append(gathered_mse(preds, targets, info))
            else:
                errors.append(reduced_mse(preds, targets))
            del preds, targets
    return {"mse": errors}


def gathered_mse(preds, targets, info) -> float | None:
    everyone = [[torch.empty_like(t) for _ in range(info.world_size)] if info.is_main else None
                for t in (preds, targets)]
    dist.gather(preds, everyone[0], dst=0)
    dist.gather(targets, everyone[1], dst=0)
    if not info.is_main:
        return None
    total = sum(float((p - t).pow_(2).sum(dtype=torch.float64)) for p, t in zip(*everyone))
    return total / (preds.numel() * info.world_size)


def reduced_mse(preds, targets) -> float:
    total = torch.stack([(preds - targets).pow_(2).sum(dtype=torch.float64),
                         torch.tensor(float(preds.numel()), dtype=torch.float64)])
    dist.all_reduce(total)
    return float(total[0] / total[1])
