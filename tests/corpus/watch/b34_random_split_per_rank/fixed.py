"""Train a small MLP classifier with DDP on 2 CPU ranks: 80 synthetic samples split 64/16 into
train/validation, light input-noise augmentation, global batch 16, validation loss after each epoch."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, random_split

SEED = 42
GLOBAL_BATCH = 16


def make_dataset(n=80):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = ((x[:, 0] * x[:, 1] + x[:, 2]) > 0).long()
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(SEED + rank)  # different augmentation noise on each rank

    ds = make_dataset()
    train_set, val_set = random_split(ds, [64, 16], generator=torch.Generator().manual_seed(SEED))
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=SEED)
    train_loader = DataLoader(train_set, batch_size=GLOBAL_BATCH // world_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x = x + 0.05 * torch.randn_like(x)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        model.eval()
        totals = torch.zeros(3)
        with torch.no_grad():
            for x, y in val_loader:
                logits = model.module(x)
                totals += torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                                        (logits.argmax(1) == y).sum().item(), len(y)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch} train loss {loss.item():.4f} val loss {totals[0] / totals[2]:.4f} "
                  f"val acc {totals[1] / totals[2]:.3f}")

    if os.environ.get("STATE_DUMP_DIR"):
        torch.save({"model": model.module.state_dict(), "train_idx": list(train_set.indices),
                    "val_idx": list(val_set.indices)}, os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
