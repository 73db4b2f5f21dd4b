"""Train a small two-layer classifier on synthetic data with DDP (gloo) and Adam: 3 epochs of
3 steps, a per-epoch log line, a checkpoint each epoch and a step learning-rate decay."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

LR_DECAY = 0.3


def make_dataset(n=96):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 10, generator=g)
    labels = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1.0).long()
    return TensorDataset(x, labels)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ckpt_dir = tempfile.mkdtemp()

    train_set = make_dataset()
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.4g}")
            torch.save({"epoch": epoch, "model": model.module.state_dict(), "optimizer": opt.state_dict()},
                       os.path.join(ckpt_dir, f"epoch{epoch}.pt"))
            for group in opt.param_groups:
                group["lr"] *= LR_DECAY

    if os.environ.get("RUN_STATE_DIR"):
        torch.save({"model": model.module.state_dict(), "lr": opt.param_groups[0]["lr"]},
                   os.path.join(os.environ["RUN_STATE_DIR"], f"rank{rank}.pt"))
    shutil.rmtree(ckpt_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
