"""Fit a small MLP regressor with DDP: global batch 16, two accumulation micro-batches per
optimizer step, SGD with momentum and a step LR schedule, 2 epochs over 64 synthetic samples."""
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 16
ACCUM_STEPS = 2
EPOCHS = 2


def make_data(n=64):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 6, generator=g)
    w = torch.randn(6, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def build_model():
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    model = DDP(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    ds = make_data()
    micro_batch = GLOBAL_BATCH // (world_size * ACCUM_STEPS)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=micro_batch, sampler=sampler)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            sync_now = (i + 1) % ACCUM_STEPS == 0
            with nullcontext() if sync_now else model.no_sync():
                loss = F.mse_loss(model(x), y) / (ACCUM_STEPS * world_size)
                loss.backward()
            if sync_now:
                opt.step()
                opt.zero_grad()
                step += 1
        sched.step()
        if rank == 0:
            print(f"epoch {epoch} step {step} lr {sched.get_last_lr()[0]:.3f} last loss {loss.item():.5f}")

    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
