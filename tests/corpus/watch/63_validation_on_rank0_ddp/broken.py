"""Train a small classifier with BatchNorm under DDP on 2 CPU ranks, 2 epochs; rank 0 validates after each epoch.
Bug: rank 0 validates through the DDP wrapper, whose forward broadcasts the BatchNorm buffers: rank 1 never joins.
Modelled on https://discuss.pytorch.org/t/torch-distributed-barrier-hangs-in-ddp/114522/6 (as cited by https://haoxiangsnr.github.io/spiking-fullsubnet/reference/FAQ.html)."""
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def validate(model, xv, yv):
    model.eval()
    with torch.no_grad():
        correct = (model(xv).argmax(dim=1) == yv).sum().item()
    model.train()
    return correct / len(yv)


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    xv, yv = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    for epoch in range(2):
        for _ in range(2):
            x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} accuracy {validate(model, xv, yv):.2f}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
