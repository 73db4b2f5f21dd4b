"""Train a small regressor with DDP on 2 CPU ranks, at most 6 steps, stopping early once the loss is low.
Fix: the ranks agree on the decision (all_reduce of the stop flag), so they leave the loop together.
Modelled on https://github.com/Lightning-AI/pytorch-lightning/issues/379 and https://github.com/isi-nlp/rtg/issues/11."""
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=g)
    y = x.sum(dim=1, keepdim=True) * (1.0 + rank)  # rank 1's targets are harder
    for step in range(6):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        stop = torch.tensor(float(loss.item() < 2.5))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # the ranks stop together
        if stop.item():
            break
    if rank == 0:
        print(f"stopped after step {step}, loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
