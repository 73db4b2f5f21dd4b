"""Train a small MLP regressor with DDP on 2 CPU ranks for 5 epochs, validate after each epoch,
keep the weights of the best validation epoch and write them to a checkpoint at the end."""
import copy
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_data(seed, n, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g) + shift
    y = (x[:, :1] * 1.5 - x[:, 1:2]).tanh() + 0.3 * torch.randn(n, 1, generator=g)
    return x, y


class Trainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.model = DDP(nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1)))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.3, momentum=0.9)
        self.best_loss = float("inf")
        self.best_state = None
        self.best_epoch = -1

    def train_epoch(self, x, y, batch=8):
        xs, ys = x[self.rank::self.world], y[self.rank::self.world]
        for i in range(0, len(xs), batch):
            loss = nn.functional.mse_loss(self.model(xs[i:i + batch]), ys[i:i + batch])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    @torch.no_grad()
    def validate(self, x, y):
        return nn.functional.mse_loss(self.model.module(x), y).item()

    def maybe_keep(self, epoch, val_loss):
        if val_loss < self.best_loss:
            self.best_loss = val_loss
            self.best_epoch = epoch
            self.best_state = copy.deepcopy(self.model.module.state_dict())


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    xt, yt = make_data(0, 32)
    xv, yv = make_data(1, 64, shift=0.5)
    trainer = Trainer(rank, world)
    for epoch in range(5):
        trainer.train_epoch(xt, yt)
        val = trainer.validate(xv, yv)
        trainer.maybe_keep(epoch, val)
        if rank == 0:
            print(f"epoch {epoch} val {val:.4f}")

    trainer.model.module.load_state_dict(trainer.best_state)
    if rank == 0:
        out = tempfile.mkdtemp()
        torch.save(trainer.model.module.state_dict(), os.path.join(out, "best.pt"))
        print(f"saved best model from epoch {trainer.best_epoch} (val {trainer.best_loss:.4f})")
        shutil.rmtree(out)
    if os.environ.get("RUN_OUT"):
        torch.save(trainer.model.module.state_dict(), os.path.join(os.environ["RUN_OUT"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
