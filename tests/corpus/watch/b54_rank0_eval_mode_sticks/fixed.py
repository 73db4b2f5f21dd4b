"""Train a small regressor with BatchNorm under DDP on 2 CPU ranks with a small Trainer class
that checks a held-out set every few steps."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g) * 2.0 + 1.0
    y = (x[:, :3].sum(dim=1, keepdim=True) - x[:, 3:].prod(dim=1, keepdim=True)).tanh()
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, model, train_ds, val_ds, rank, world):
        self.rank = rank
        self.model = DDP(model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
        self.loader = DataLoader(train_ds, batch_size=8, sampler=self.sampler)
        self.val_ds = val_ds
        self.step = 0

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        x, y = self.val_ds.tensors
        loss = F.mse_loss(self.model.module(x), y).item()
        self.model.train()
        return loss

    def fit(self, epochs, eval_every):
        self.model.train()
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            for x, y in self.loader:
                loss = F.mse_loss(self.model(x), y)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                self.step += 1
                if self.step % eval_every == 0 and self.rank == 0:
                    print(f"step {self.step} train {loss.item():.4f} val {self.evaluate():.4f}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    trainer = Trainer(model, make_data(64, 1), make_data(32, 2), rank, world)
    trainer.fit(epochs=2, eval_every=3)
    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(trainer.model.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
