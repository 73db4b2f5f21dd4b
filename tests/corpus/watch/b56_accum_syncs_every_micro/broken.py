"""Train a small MLP regressor under DDP on 2 CPU ranks from a streaming (iterable) dataset,
with gradient accumulation over 4 micro-batches per optimizer step and a step LR schedule."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

ACCUM_STEPS = 4


class Stream(IterableDataset):
    def __init__(self, n, rank, world):
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        g = torch.Generator().manual_seed(7)
        for i in range(self.n):
            x = torch.randn(8, generator=g)
            if i % self.world == self.rank:
                yield x, (x[:4] * x[4:]).sum().unsqueeze(0)


def accumulate(model, micro_batches):
    total = 0.0
    for x, y in micro_batches:
        loss = F.mse_loss(model(x), y) / len(micro_batches)
        loss.backward()
        total += loss.item()
    return total


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    loader = DataLoader(Stream(192, rank, world), batch_size=8)
    buf = []
    for x, y in loader:
        buf.append((x, y))
        if len(buf) < ACCUM_STEPS:
            continue
        opt.zero_grad()
        loss = accumulate(model, buf)
        opt.step()
        sched.step()
        buf = []
        if rank == 0:
            print(f"lr {sched.get_last_lr()[0]:.4f} loss {loss:.4f}")
    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
