"""Train a small regressor with DDP on 2 CPU ranks (2 epochs, 5 optimizer steps each, each
step accumulating 2 micro-batches of 4 samples per rank), then validate after each epoch on
validation files dealt out to the ranks in turn; rank 0 prints the validation loss."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

VAL_FILE_SIZES = [30, 10, 8]


def make_file(seed, n, noise):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = x[:, :1] * 2.0 - x[:, 1:2] + noise * torch.randn(n, 1, generator=g)
    return x, y


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()

    x_train, y_train = make_file(0, 80, 0.1)
    xs, ys = x_train[rank::world_size], y_train[rank::world_size]
    val_files = [make_file(10 + k, n, 0.2 + 0.8 * k) for k, n in enumerate(VAL_FILE_SIZES)]
    my_val = val_files[rank::world_size]

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    accum = 2

    for epoch in range(2):
        model.train()
        for step in range(5):
            opt.zero_grad()
            for micro in range(accum):
                i = (step * accum + micro) * 4
                xb, yb = xs[i:i + 4], ys[i:i + 4]
                if micro < accum - 1:
                    with model.no_sync():
                        (nn.functional.mse_loss(model(xb), yb) / accum).backward()
                else:
                    (nn.functional.mse_loss(model(xb), yb) / accum).backward()
            opt.step()

        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for xv, yv in my_val:
                total += nn.functional.mse_loss(model(xv), yv, reduction="sum").item()
                count += len(yv)
        val_loss = torch.tensor([total / count])
        dist.all_reduce(val_loss, op=dist.ReduceOp.SUM)
        val_loss /= world_size
        if rank == 0:
            print(f"epoch {epoch} val loss {val_loss.item():.6f}")

    if os.environ.get("RUN_STATE_OUT"):
        torch.save(model.module.state_dict(), f"{os.environ['RUN_STATE_OUT']}.rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
