"""Fit a small MLP to sensor readings with DDP on 2 CPU ranks. Each rank reads its own contiguous
shard of 128 synthetic records (a few come with glitched targets) in batches of 8; SGD with momentum.
A step whose loss is non-finite or above MAX_LOSS is skipped."""
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

N_RECORDS = 128
BATCH = 8
MAX_LOSS = 100.0


def make_data():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(N_RECORDS, 8, generator=g)
    y = x @ torch.linspace(-0.5, 0.5, 8).unsqueeze(1) + 0.1 * torch.randn(N_RECORDS, 1, generator=g)
    glitched = torch.randperm(N_RECORDS, generator=g)[:2]
    y[glitched] = 1000.0
    return x, y


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data()
    per_rank = N_RECORDS // world
    x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]

    model = DDP(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(per_rank // BATCH):
        xb, yb = x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH]
        loss = nn.functional.mse_loss(model(xb), yb)
        bad = torch.tensor(0.0 if math.isfinite(loss.item()) and loss.item() < MAX_LOSS else 1.0)
        dist.broadcast(bad, src=0)
        if bad.item():
            if rank == 0:
                print(f"step {step}: loss out of range, skipping")
            continue
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")

    if os.environ.get("RUN_STATE_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["RUN_STATE_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
