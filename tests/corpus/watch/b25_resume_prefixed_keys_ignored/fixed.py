"""Train a small MLP regressor with DDP on 2 CPU ranks, reading a synthetic stream through an
IterableDataset that gives each rank every other sample. Adam. A first job trains one pass over
the stream (4 steps) and checkpoints; the job is then restarted from the checkpoint and trains a
second pass."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __init__(self, n, rank, world):
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.n, 6, generator=g)
        y = x[:, :2].sum(dim=1, keepdim=True) - x[:, 2:3] ** 2
        for i in range(self.rank, self.n, self.world):
            yield x[i], y[i]


def make_model():
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))


def run_job(ckpt_path, stop_epoch):
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = DataLoader(Stream(32, rank, world), batch_size=4)

    torch.manual_seed(0)
    model = make_model()
    ckpt = torch.load(ckpt_path) if os.path.exists(ckpt_path) else None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"], strict=False)
    model = DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    start_epoch = 0
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1
        if rank == 0:
            print(f"resumed from epoch {ckpt['epoch']}")

    for epoch in range(start_epoch, stop_epoch):
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                print(f"epoch {epoch} step {i} loss {loss.item():.4f}")
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, ckpt_path)
        dist.barrier()
    return model


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    box = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_path = os.path.join(box[0], "ckpt.pt")

    run_job(ckpt_path, stop_epoch=1)          # first job
    model = run_job(ckpt_path, stop_epoch=2)  # restarted job

    out = os.environ.get("FINAL_STATE_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
