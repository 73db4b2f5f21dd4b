"""Train a small compiled residual regressor with DDP on CPU ranks from a streaming
IterableDataset (each rank draws its own stream); the residual branch is ramped in over the
first batches the model sees."""
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __init__(self, seed):
        self.seed = seed
        self.w = torch.linspace(-1.0, 1.0, 10)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            x = torch.randn(10, generator=g)
            yield x, (x @ self.w).sin().unsqueeze(0)


class RampedResNet(nn.Module):
    def __init__(self, d_in=10, width=24, ramp_batches=40):
        super().__init__()
        self.stem = nn.Linear(d_in, width)
        self.block = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.head = nn.Linear(width, 1)
        self.ramp_batches = ramp_batches
        self.seen_batches = 0

    def forward(self, x):
        if self.training:
            self.seen_batches += 1
        alpha = min(1.0, self.seen_batches / self.ramp_batches)
        h = torch.relu(self.stem(x))
        h = h + alpha * self.block(h)
        return self.head(h)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.compile(DDP(RampedResNet()), backend="aot_eager")
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loader = DataLoader(Stream(seed=100 + rank), batch_size=16)

    for step, (x, y) in enumerate(itertools.islice(loader, 10)):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 3 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
