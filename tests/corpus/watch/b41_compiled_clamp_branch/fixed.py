"""Train a small compiled MLP classifier with DDP on CPU ranks: each rank takes its own shard
of a synthetic two-class dataset, SGD with momentum and a step learning-rate schedule."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Classifier(nn.Module):
    def __init__(self, d_in=12, hidden=32, n_cls=2, act_limit=3.0):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.head = nn.Linear(hidden, n_cls)
        self.act_limit = act_limit

    def forward(self, x):
        h = self.enc(x)
        h = h.clamp(-self.act_limit, self.act_limit)
        return self.head(torch.relu(h))


def make_data(n=256):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 12, generator=g) * 2.0
    y = (x[:, 0] * x[:, 1] + x[:, 2] > 0).long()
    return x, y


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Classifier())
    model = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)

    x, y = make_data()
    x, y = x[rank::world], y[rank::world]
    batch = 16
    for step in range(8):
        i = (step * batch) % x.shape[0]
        xb, yb = x[i:i + batch], y[i:i + batch]
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
