"""Train a tiny regressor on 2 ranks (DDP, gloo) with 4 micro-batches per step; log the step's loss.
Fix: the micro-batch losses are already divided by ACCUM for backward: their sum is the step's mean
loss, logged as it is. Cites https://github.com/espnet/espnet/issues/5090."""
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 4


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(10 + rank)
    for step in range(3):
        running = torch.zeros(())
        for micro in range(ACCUM):
            x = torch.randn(8, 6, generator=g)
            y = x.sum(dim=1, keepdim=True)
            with model.no_sync() if micro < ACCUM - 1 else nullcontext():
                loss = F.mse_loss(model(x), y) / ACCUM
                loss.backward()
            running += loss.detach()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(running)
        running /= world
        if rank == 0:
            print(f"step {step} train loss {running.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
