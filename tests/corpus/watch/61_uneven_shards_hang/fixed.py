"""Train a small regressor with DDP on 2 CPU ranks, one epoch over 21 samples split between the ranks by hand.
Fix: DistributedSampler splits the samples, padding to the same count on every rank (11 each: 3 batches on both).
Modelled on https://github.com/mlcommons/storage/issues/455 and https://github.com/argonne-lcf/dlio_benchmark/pull/339."""
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n=21):
    g = torch.Generator().manual_seed(0)  # the same 21 samples on every rank
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = make_dataset()
    loader = DataLoader(ds, batch_size=5, sampler=DistributedSampler(ds, shuffle=False))
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
