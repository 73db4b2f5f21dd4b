"""Train a small residual MLP regressor with DDP on CPU ranks, reading a synthetic dataset
through a DistributedSampler, and report the mean step time."""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class ResMLP(nn.Module):
    def __init__(self, d_in=8, width=16, depth=8):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.blocks(self.inp(x)))


def make_dataset(n=320):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) - x[:, 4:].prod(dim=1, keepdim=True)).tanh()
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(ResMLP())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ds = make_dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=32, sampler=sampler)

    step_times = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            t0 = time.perf_counter()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step_times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} "
                  f"mean step {1e3 * sum(step_times) / len(step_times):.2f} ms")

    out_dir = os.environ.get("TRAIN_STATS_DIR")
    if out_dir:
        torch.save({"step_times": step_times,
                    "ddp": model._get_ddp_logging_data(),
                    "state": model.module.state_dict()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
