"""Train a small MLP regressor with DDP on a synthetic dataset (64 train / 32 validation samples),
5 epochs, Adam, with ReduceLROnPlateau on the validation loss."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    w = torch.linspace(-1.0, 1.0, 6)
    y = torch.sin(x @ w).unsqueeze(1) + 0.5 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    stats = torch.zeros(2)
    for x, y in loader:
        stats[0] += nn.functional.mse_loss(model(x), y, reduction="sum")
        stats[1] += len(x)
    model.train()
    dist.reduce(stats, dst=0)
    return (stats[0] / stats[1]).item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0)

    train_set, val_set = make_data(64, seed=1), make_data(32, seed=2)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=16, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=16, sampler=DistributedSampler(val_set, shuffle=False))

    for epoch in range(5):
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val_loss = evaluate(model, val_loader)
        sched.step(val_loss)
        if rank == 0:
            print(f"epoch {epoch} train {loss.item():.4f} val {val_loss:.4f} lr {opt.param_groups[0]['lr']:.4g}")

    if os.environ.get("RUN_STATE_DIR"):
        torch.save({"model": model.module.state_dict(), "lr": opt.param_groups[0]["lr"]},
                   os.path.join(os.environ["RUN_STATE_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
