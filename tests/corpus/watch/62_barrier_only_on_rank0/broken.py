"""Train a small regressor with DDP on 2 CPU ranks, 4 steps, saving a checkpoint every 2 steps.
Bug: the saving code calls dist.barrier() inside `if rank == 0:`, so only rank 0 enters it.
Modelled on https://github.com/talmolab/sleap-nn/pull/437 (a barrier only some ranks reach)."""
import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def save_checkpoint(model, step, rank):
    if rank == 0:
        path = os.path.join(tempfile.gettempdir(), f"ckpt_{os.getpid()}.pt")
        torch.save(model.module.state_dict(), path)
        os.remove(path)
        dist.barrier()  # wait until the checkpoint is written


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        x = torch.randn(8, 4, generator=g)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 2 == 1:
            save_checkpoint(model, step, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
