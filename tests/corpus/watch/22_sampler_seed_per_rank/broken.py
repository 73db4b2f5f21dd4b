"""Train a small regressor with DDP on 2 CPU ranks; each rank seeds its RNGs with base_seed + rank.
Bug: the same per-rank seed goes to DistributedSampler, so the ranks shuffle differently and their shares overlap.
Modelled on https://github.com/mlcommons/training/pull/625 and https://github.com/NVlabs/LongLive/issues/71."""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(args.seed)  # the dataset: the same on every rank
    x = torch.randn(48, 6, generator=g)
    dataset = TensorDataset(x, x @ torch.ones(6, 1))
    torch.manual_seed(args.seed)
    model = DDP(nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1)))
    seed = args.seed + rank
    torch.manual_seed(seed)  # a different noise stream per rank, for augmentation
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb + 0.01 * torch.randn_like(xb)), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
