"""Train a small MLP regressor with DDP (gloo) on a synthetic stream of 160 samples read through an
IterableDataset, with gradient accumulation and SGD + momentum. The recipe's learning rate (BASE_LR)
was tuned for a batch of REF_BATCH samples and is scaled linearly with the batch size."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

BASE_LR = 0.2
REF_BATCH = 64
ACCUM = 2


class SensorStream(IterableDataset):
    def __init__(self, n, rank, world):
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        g = torch.Generator().manual_seed(7)
        w = torch.tensor([0.5, -1.0, 0.25, 2.0, -0.5, 1.0])
        for i in range(self.n):
            x = torch.randn(6, generator=g)
            y = torch.tanh(x @ w).unsqueeze(0) + 0.05 * torch.randn(1, generator=g)
            if i % self.world == self.rank:
                yield x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch per process")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 1)))
    lr = BASE_LR * args.batch_size * ACCUM * world / REF_BATCH
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if rank == 0:
        print(f"world {world} micro-batch {args.batch_size} accum {ACCUM} lr {lr:.4g}")

    loader = DataLoader(SensorStream(160, rank, world), batch_size=args.batch_size)
    for i, (x, y) in enumerate(loader):
        if (i + 1) % ACCUM != 0:
            with model.no_sync():
                (nn.functional.mse_loss(model(x), y) / ACCUM).backward()
            continue
        loss = nn.functional.mse_loss(model(x), y) / ACCUM
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {i // ACCUM} loss {loss.item() * ACCUM:.4f}")

    if os.environ.get("RUN_STATE_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["RUN_STATE_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
