"""Train a small regressor with DDP on 2 CPU ranks, one epoch over 21 samples split between the ranks by hand.
Bug: the hand split (ceil, then clamp) gives rank 0 11 samples, rank 1 10: 3 batches against 2.
Modelled on https://github.com/mlcommons/storage/issues/455 and https://github.com/argonne-lcf/dlio_benchmark/pull/339."""
import math
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


def make_dataset(n=21):
    g = torch.Generator().manual_seed(0)  # the same 21 samples on every rank
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = make_dataset()
    per_rank = math.ceil(len(ds) / world)
    shard = Subset(ds, range(rank * per_rank, min(len(ds), (rank + 1) * per_rank)))
    loader = DataLoader(shard, batch_size=5)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"epoch done, loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
