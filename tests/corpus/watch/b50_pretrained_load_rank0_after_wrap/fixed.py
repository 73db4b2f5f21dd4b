"""Pretrain a small MLP regressor on a synthetic task, then fine-tune it on a second task with DDP
on 2 CPU ranks, starting the fine-tuning from the pretrained weights saved by the first stage."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.body(x))


def make_task(seed, n=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    w = torch.randn(6, 1, generator=g)
    return x, torch.sin(x @ w)


class Trainer:
    def __init__(self, rank, world, lr):
        self.rank, self.world = rank, world
        self.model = DDP(Net())
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)

    def load_pretrained(self, path):
        state = torch.load(path, map_location="cpu")
        self.model.module.load_state_dict(state)

    def fit(self, x, y, steps, batch=8, tag=""):
        xs, ys = x[self.rank::self.world], y[self.rank::self.world]
        for step in range(steps):
            i = (step * batch) % len(xs)
            loss = nn.functional.mse_loss(self.model(xs[i:i + batch]), ys[i:i + batch])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if dist.get_rank() == 0:
                print(f"{tag} step {step} loss {loss.item():.4f}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ckpt_dir = tempfile.mkdtemp() if rank == 0 else None
    box = [ckpt_dir]
    dist.broadcast_object_list(box, src=0)
    ckpt_dir = box[0]
    path = os.path.join(ckpt_dir, "pretrained.pt")

    pre = Trainer(rank, world, lr=0.01)
    pre.fit(*make_task(1), steps=4, tag="pretrain")
    if rank == 0:
        torch.save(pre.model.module.state_dict(), path)
    dist.barrier()

    torch.manual_seed(100 + rank)
    ft = Trainer(rank, world, lr=0.005)
    ft.load_pretrained(path)
    ft.fit(*make_task(2), steps=6, tag="finetune")

    if os.environ.get("RUN_OUT"):
        torch.save(ft.model.module.state_dict(), os.path.join(os.environ["RUN_OUT"], f"rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
