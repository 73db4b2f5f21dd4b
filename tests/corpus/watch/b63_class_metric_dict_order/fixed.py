"""Train a 3-class classifier (bird / cat / dog, 5 features) with DDP on 2 CPU ranks for 2 epochs
(6 optimizer steps), then evaluate on a held-out set split over the ranks and report the
per-class accuracy of the whole set on rank 0."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CLASSES = ["bird", "cat", "dog"]


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = 1.2 * torch.randn(len(CLASSES), 5, generator=torch.Generator().manual_seed(123))
    y = torch.randint(0, len(CLASSES), (n,), generator=g)
    x = centers[y] + torch.randn(n, 5, generator=g)
    return TensorDataset(x, y)


def make_model():
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, len(CLASSES)))


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    stats = {}
    for x, y in loader:
        hits = (model(x).argmax(dim=1) == y).float()
        for label, hit in zip(y.tolist(), hits.tolist()):
            s = stats.setdefault(CLASSES[label], torch.zeros(2))
            s[0] += hit
            s[1] += 1
    model.train()
    return stats


def sync_stats(stats):
    for name in sorted(stats):
        dist.all_reduce(stats[name])
    return {name: (s[0] / s[1]).item() for name, s in stats.items()}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    train_ds, val_ds = make_data(96, seed=1), make_data(48, seed=2)
    train_sampler = DistributedSampler(train_ds, shuffle=True, seed=0)
    train_loader = DataLoader(train_ds, batch_size=16, sampler=train_sampler)
    val_loader = DataLoader(val_ds, batch_size=8, sampler=DistributedSampler(val_ds, shuffle=False))

    model = DDP(make_model())
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")

    acc = sync_stats(evaluate(model, val_loader))
    if rank == 0:
        print("val acc " + " ".join(f"{name}={value:.4f}" for name, value in sorted(acc.items())))
    if os.environ.get("TRAIN_DUMP_DIR") and rank == 0:
        torch.save(model.module.state_dict(), os.path.join(os.environ["TRAIN_DUMP_DIR"], "model.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
