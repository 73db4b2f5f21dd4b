"""Train a small MLP regressor with DDP on 2 CPU ranks, SGD with momentum and a warm-up + cosine
learning-rate schedule stepped every batch. A first job trains 2 epochs and checkpoints; the job is
then restarted from the checkpoint and trains the remaining 2 epochs."""
import math
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TOTAL_EPOCHS = 4
WARMUP_STEPS = 2
BASE_LR = 0.05


def make_dataset(n=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def warmup_cosine(total_steps):
    def factor(step):
        if step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        progress = (step - WARMUP_STEPS) / (total_steps - WARMUP_STEPS)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def run_job(ckpt_path, stop_epoch):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(make_model())
    ds = make_dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(TOTAL_EPOCHS * len(loader)))

    start_epoch = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        start_epoch = ckpt["epoch"] + 1
        if rank == 0:
            print(f"resumed from epoch {ckpt['epoch']}")

    for epoch in range(start_epoch, stop_epoch):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            lr = opt.param_groups[0]["lr"]
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if rank == 0:
                print(f"epoch {epoch} batch {i} loss {loss.item():.4f} lr {lr:.5f}")
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "epoch": epoch}, ckpt_path)
        dist.barrier()
    return model


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ckpt_dir = tempfile.mkdtemp() if rank == 0 else None
    box = [ckpt_dir]
    dist.broadcast_object_list(box, src=0)
    ckpt_path = os.path.join(box[0], "last.pt")

    run_job(ckpt_path, stop_epoch=2)               # first job, stopped after 2 epochs
    model = run_job(ckpt_path, stop_epoch=TOTAL_EPOCHS)  # restarted job

    out = os.environ.get("FINAL_STATE_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
