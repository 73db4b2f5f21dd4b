"""Train a small regressor with DDP on 2 CPU ranks for 5 epochs of 2 steps (DistributedSampler
for the training and the validation sets), validating after each epoch and lowering the
learning rate with ReduceLROnPlateau on the validation loss; rank 0 prints it."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = torch.tanh(x @ torch.tensor([[1.5], [-2.0], [0.5], [1.0]])) + 0.3 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0)

    train_ds, val_ds = make_dataset(0, 32), make_dataset(1, 24)
    train_sampler = DistributedSampler(train_ds, shuffle=True, seed=0)
    train_loader = DataLoader(train_ds, batch_size=8, sampler=train_sampler)
    val_loader = DataLoader(val_ds, batch_size=12, sampler=DistributedSampler(val_ds, shuffle=False))

    for epoch in range(5):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        model.eval()
        stats = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                stats[0] += nn.functional.mse_loss(model(x), y, reduction="sum")
                stats[1] += len(y)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        val_loss = (stats[0] / stats[1]).item()
        sched.step(val_loss)
        if rank == 0:
            print(f"epoch {epoch} val loss {val_loss:.5f} lr {opt.param_groups[0]['lr']:.4f}")

    if os.environ.get("RUN_STATE_OUT"):
        torch.save({"model": model.module.state_dict(), "lr": opt.param_groups[0]["lr"]},
                   f"{os.environ['RUN_STATE_OUT']}.rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
