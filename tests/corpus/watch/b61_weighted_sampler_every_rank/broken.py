"""Train a small binary classifier with DDP on 2 CPU ranks on an imbalanced dataset
(64 samples, 1 positive in 8), drawing batches with a class-balancing WeightedRandomSampler.
2 epochs of 2 steps per rank, batch 16 per rank."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler


def make_dataset(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (torch.arange(n) % 8 == 0).long()
    x[y == 1] += 1.0
    return TensorDataset(x, y)


def balanced_weights(labels):
    counts = torch.bincount(labels)
    return (1.0 / counts.float())[labels]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    ds = make_dataset()
    weights = balanced_weights(ds.tensors[1])
    sampler = WeightedRandomSampler(weights, num_samples=len(ds) // world, replacement=True)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    seen = []
    for epoch in range(2):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(x)
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")

    if os.environ.get("TRAIN_DUMP_DIR"):
        torch.save(torch.cat(seen), os.path.join(os.environ["TRAIN_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
