"""Train a small MLP classifier with DDP on 2 CPU ranks (48 training samples, global batch 16,
2 epochs), evaluate the 7-sample held-out set across ranks after each epoch and keep the best
checkpoint by validation loss."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 16


def make_split(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = (x[:, 0] - 0.5 * x[:, 3] > 0.2).long()
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    train_set, val_set = make_split(48, seed=1), make_split(7, seed=2)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=GLOBAL_BATCH // world_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=4, sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    ckpt_dir = tempfile.mkdtemp() if rank == 0 else None
    best = float("inf")

    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        stats = torch.zeros(3)  # loss sum, correct, count
        with torch.no_grad():
            for x, y in val_loader:
                logits = model.module(x)
                stats += torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                                       (logits.argmax(1) == y).sum().item(), len(y)])
        dist.all_reduce(stats)
        val_loss, val_acc = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()
        if rank == 0:
            print(f"epoch {epoch} val loss {val_loss:.5f} val acc {val_acc:.4f}")
            if val_loss < best:
                best = val_loss
                torch.save(model.module.state_dict(), os.path.join(ckpt_dir, "best.pt"))

    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    if rank == 0:
        shutil.rmtree(ckpt_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
