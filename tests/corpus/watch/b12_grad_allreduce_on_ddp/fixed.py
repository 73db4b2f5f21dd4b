"""Fit a small MLP regressor with DDP on 2 CPU ranks from a streamed (iterable) dataset
that each rank reads every other sample of; SGD with momentum and a StepLR schedule, 10 steps."""
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class SineStream(IterableDataset):
    def __init__(self, n, rank, world_size, seed=0):
        self.n, self.rank, self.world_size, self.seed = n, rank, world_size, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for i in range(self.n):
            x = torch.rand(3, generator=g) * 2 * math.pi
            y = torch.sin(x).sum(0, keepdim=True)
            if i % self.world_size == self.rank:
                yield x, y


def sync_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(3, 24), nn.Tanh(), nn.Linear(24, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    loader = DataLoader(SineStream(160, rank, world_size), batch_size=8)

    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if rank == 0:
            print(f"step {step} lr {sched.get_last_lr()[0]:.4f} loss {loss.item():.4f}")

    if os.environ.get("RUN_STATE_OUT"):
        torch.save(model.module.state_dict(), f"{os.environ['RUN_STATE_OUT']}.rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
