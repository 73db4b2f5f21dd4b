"""Train a small MLP regressor with DDP on 2 CPU ranks, AdamW with a no-decay group for biases, and
gradient accumulation over 2 micro-batches per optimizer step. Each rank reads its own shard of a
synthetic dataset. A first job runs 4 optimizer steps and checkpoints; the job is then restarted
from the checkpoint and runs 4 more."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

TOTAL_STEPS = 8
ACCUM = 2
MICRO = 4


def make_data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 10, generator=g)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def make_model():
    return nn.Sequential(nn.Linear(10, 24), nn.GELU(), nn.Linear(24, 1))


def make_optimizer(model):
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": no_decay, "weight_decay": 0.0}], lr=1e-2)


def setup(ckpt_path):
    torch.manual_seed(0)
    model = make_model()
    optimizer = make_optimizer(model)
    start = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"]
    ddp_model = DDP(model)
    return ddp_model, optimizer, start


def run_job(ckpt_path, stop_step):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data()
    xs, ys = x[rank::world], y[rank::world]
    per_step = MICRO * ACCUM
    model, optimizer, start = setup(ckpt_path)
    if start and rank == 0:
        print(f"resumed at step {start}")

    for step in range(start, stop_step):
        j = (step % (len(xs) // per_step)) * per_step
        optimizer.zero_grad()
        for k in range(ACCUM):
            xb, yb = xs[j + k * MICRO:j + (k + 1) * MICRO], ys[j + k * MICRO:j + (k + 1) * MICRO]
            if k < ACCUM - 1:
                with model.no_sync():
                    (nn.functional.mse_loss(model(xb), yb) / ACCUM).backward()
            else:
                (nn.functional.mse_loss(model(xb), yb) / ACCUM).backward()
        optimizer.step()
        if rank == 0:
            with torch.no_grad():
                full = nn.functional.mse_loss(model.module(x), y).item()
            print(f"step {step} loss {full:.4f}")

    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": stop_step},
                   ckpt_path)
    dist.barrier()
    return model, optimizer


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    box = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_path = os.path.join(box[0], "ckpt.pt")

    run_job(ckpt_path, stop_step=4)                              # first job
    model, optimizer = run_job(ckpt_path, stop_step=TOTAL_STEPS)  # restarted job

    out = os.environ.get("FINAL_STATE_DIR")
    if out:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
