"""Train a small MLP regressor with DDP on 2 CPU ranks (DataLoader + DistributedSampler, SGD with
momentum, StepLR per epoch). The job is preemptible: each run trains 2 more epochs from the last
checkpoint if there is one, then checkpoints. Here a first run and one restart, 4 epochs in all."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EPOCHS_PER_RUN = 2


def make_dataset(n=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = torch.tanh(x @ torch.randn(8, 2, generator=g))
    return TensorDataset(x, y)


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def run_job(ckpt_path):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ds = make_dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)

    start_epoch = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        start_epoch = ckpt["epoch"] + 1
        if rank == 0:
            print(f"resumed from epoch {ckpt['epoch']}")

    for epoch in range(start_epoch, start_epoch + EPOCHS_PER_RUN):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "epoch": epoch}, ckpt_path)
        dist.barrier()
    return model


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ckpt_dir = tempfile.mkdtemp()
    ckpt_path = os.path.join(ckpt_dir, "last.pt")

    run_job(ckpt_path)          # first run
    model = run_job(ckpt_path)  # restarted run

    out = os.environ.get("FINAL_STATE_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
