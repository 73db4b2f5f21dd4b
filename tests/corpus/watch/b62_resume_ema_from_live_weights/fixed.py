"""Train a small regressor with DDP on 2 CPU ranks through a Trainer class that keeps an EMA copy
of the weights for evaluation. The run trains 5 steps, checkpoints, then (as after a preemption)
a fresh Trainer resumes from the checkpoint and trains 5 more steps; rank 0 reports the EMA's
held-out loss."""
import copy
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 16


def make_data():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 1, generator=g)
    x = torch.randn(10 * BATCH + 32, 6, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(x.shape[0], 1, generator=g)
    return (x[:-32], y[:-32]), (x[-32:], y[-32:])


class EMA:
    def __init__(self, module, decay=0.8):
        self.decay = decay
        self.shadow = copy.deepcopy(module).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, module):
        for s, p in zip(self.shadow.parameters(), module.parameters()):
            s.lerp_(p.detach(), 1.0 - self.decay)

    def state_dict(self):
        return self.shadow.state_dict()

    def load_state_dict(self, state):
        self.shadow.load_state_dict(state)


class Trainer:
    def __init__(self, train, val):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        self.model = DDP(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1)))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-2, weight_decay=1e-2)
        self.ema = EMA(self.model.module)
        self.train_x, self.train_y = train
        self.val_x, self.val_y = val
        self.step = 0

    def train_step(self):
        lo = self.step * BATCH
        x = self.train_x[lo:lo + BATCH][self.rank::self.world]
        y = self.train_y[lo:lo + BATCH][self.rank::self.world]
        loss = F.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.ema.update(self.model.module)
        self.step += 1
        return loss.item()

    @torch.no_grad()
    def ema_val_loss(self):
        return F.mse_loss(self.ema.shadow(self.val_x), self.val_y).item()

    def dump(self, tag):
        if os.environ.get("TRAIN_DUMP_DIR"):
            torch.save({"model": self.model.module.state_dict(), "ema": self.ema.state_dict()},
                       os.path.join(os.environ["TRAIN_DUMP_DIR"], f"{tag}_rank{self.rank}.pt"))

    def save(self, path):
        if self.rank == 0:
            torch.save({"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                        "ema": self.ema.state_dict(), "step": self.step}, path)
        dist.barrier()
        self.dump("saved")

    def resume(self, path):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        self.model.module.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["opt"])
        self.ema.load_state_dict(ckpt["ema"])
        self.step = ckpt["step"]
        self.dump("resumed")


def main():
    dist.init_process_group("gloo")
    train, val = make_data()
    ckpt_dir = tempfile.mkdtemp() if dist.get_rank() == 0 else None
    holder = [ckpt_dir]
    dist.broadcast_object_list(holder, src=0)
    path = os.path.join(holder[0], "last.pt")

    trainer = Trainer(train, val)
    for _ in range(5):
        loss = trainer.train_step()
        if trainer.rank == 0:
            print(f"step {trainer.step} loss {loss:.4f} ema val {trainer.ema_val_loss():.4f}")
    trainer.save(path)

    trainer = Trainer(train, val)
    trainer.resume(path)
    for _ in range(5):
        loss = trainer.train_step()
        if trainer.rank == 0:
            print(f"step {trainer.step} loss {loss:.4f} ema val {trainer.ema_val_loss():.4f}")

    dist.barrier()
    if trainer.rank == 0:
        shutil.rmtree(holder[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
