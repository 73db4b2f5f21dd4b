"""Train a small regressor with DDP on 2 CPU ranks, 3 steps, then sum each evaluation metric over the ranks.
Fix: every rank reduces the metrics in one order (sorted by name): each all_reduce pairs the same metric.
Modelled on https://github.com/EvolvingLMMs-Lab/lmms-eval/pull/1089 and https://github.com/Lightning-AI/torchmetrics/issues/159."""
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.nn.functional import all_reduce
from torch.nn.parallel import DistributedDataParallel as DDP


def evaluate(model, batches):
    stats = {}
    with torch.no_grad():
        for x, y, kind in batches:
            err = model.module(x) - y
            if kind == "clean":
                stats["clean_sq_err"] = stats.get("clean_sq_err", 0) + err.pow(2).sum()
            else:
                stats["noisy_err_hist"] = stats.get("noisy_err_hist", 0) + torch.histc(err, 4, -2, 2)
    totals = {name: all_reduce(stats[name]) for name in sorted(stats)}
    return totals


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    data = [(x, x.sum(dim=1, keepdim=True)) for x in torch.randn(4, 8, 4, generator=g)]
    for step in range(3):
        x, y = data[rank]
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    kinds = ["clean", "noisy", "noisy", "clean"]  # the validation batches, split between the ranks
    val = [(x, y, kind) for (x, y), kind in zip(data, kinds)][rank::2]
    totals = evaluate(model, val)
    if rank == 0:
        print({name: value.tolist() for name, value in totals.items()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
