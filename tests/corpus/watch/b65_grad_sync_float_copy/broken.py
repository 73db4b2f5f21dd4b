"""Train a small bfloat16 MLP regressor on 2 CPU ranks with a hand-written data-parallel trainer:
each rank takes its own shard of a seeded dataset, gradients are averaged across ranks after
backward, SGD with momentum, 8 steps."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def make_shard(rank, world, n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * x[:, 4:].sum(dim=1, keepdim=True)
    return x[rank::world], y[rank::world]


class Trainer:
    def __init__(self, model, lr=0.05, batch_size=16):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.batch_size = batch_size
        self.world = dist.get_world_size()

    def sync_gradients(self):
        for p in self.model.parameters():
            if p.grad is None:
                continue
            dist.all_reduce(p.grad.float(), op=dist.ReduceOp.SUM)
            p.grad.div_(self.world)

    def train_step(self, x, y):
        pred = self.model(x.to(torch.bfloat16)).float()
        loss = nn.functional.mse_loss(pred, y)
        self.opt.zero_grad()
        loss.backward()
        self.sync_gradients()
        self.opt.step()
        return loss.detach()

    def fit(self, x, y, steps):
        for step in range(steps):
            i = (step * self.batch_size) % len(x)
            loss = self.train_step(x[i:i + self.batch_size], y[i:i + self.batch_size])
            dist.all_reduce(loss)
            if dist.get_rank() == 0:
                print(f"step {step} loss {loss.item() / self.world:.4f}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(torch.bfloat16)
    x, y = make_shard(rank, world)
    Trainer(model).fit(x, y, steps=8)
    out = os.environ.get("RUN_EXPORT_DIR")
    if out:
        torch.save(model.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
