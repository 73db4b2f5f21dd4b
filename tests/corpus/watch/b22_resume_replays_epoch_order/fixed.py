"""Train a small MLP classifier (3 classes) with DDP on 2 CPU ranks from a shuffled DataLoader
with a DistributedSampler, counting optimizer steps rather than epochs. A first job trains 4 steps
(2 epochs of 2 batches) and checkpoints; the job is then restarted and trains up to step 8."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TOTAL_STEPS = 8


def make_dataset(n=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    labels = (x[:, :3] * torch.tensor([1.0, -2.0, 0.5])).argmax(dim=1)
    return TensorDataset(x, labels)


def make_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def batches(loader, sampler, epoch=0):
    while True:
        sampler.set_epoch(epoch)
        for batch in loader:
            yield batch
        epoch += 1


def run_job(ckpt_path, stop_step):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    ds = make_dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)

    start = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"]
        if rank == 0:
            print(f"resumed at step {start}")

    data = batches(loader, sampler, epoch=start // len(loader))
    for step in range(start, stop_step):
        x, labels = next(data)
        loss = nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")

    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": stop_step}, ckpt_path)
    dist.barrier()
    return model


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    box = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_path = os.path.join(box[0], "ckpt.pt")

    run_job(ckpt_path, stop_step=4)                   # first job
    model = run_job(ckpt_path, stop_step=TOTAL_STEPS)  # restarted job

    out = os.environ.get("FINAL_STATE_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
