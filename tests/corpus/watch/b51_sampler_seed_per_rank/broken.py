"""Train a small MLP classifier with DDP on 2 CPU ranks over 3 epochs of a 40-sample dataset with
random-noise augmentation, DistributedSampler shuffling and gradient accumulation over 2 micro-batches."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

BASE_SEED = 1234
EPOCHS = 3
ACCUM = 2


class NoisyPoints(Dataset):
    def __init__(self, n=40):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 5, generator=g)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.05 * torch.randn(5), self.y[i]


def seed_everything(seed):
    torch.manual_seed(seed)
    return seed


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seed = seed_everything(BASE_SEED + rank)

    model = DDP(nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = NoisyPoints()
    sampler = DistributedSampler(ds, shuffle=True, seed=seed)
    loader = DataLoader(ds, batch_size=5, sampler=sampler)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y) / ACCUM
            if (i + 1) % ACCUM != 0:
                with model.no_sync():
                    loss.backward()
                continue
            loss.backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item() * ACCUM:.4f}")

    if os.environ.get("RUN_OUT"):
        order = {}
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            order[epoch] = list(sampler)
        torch.save(order, os.path.join(os.environ["RUN_OUT"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
