"""Mixed-precision (float16 autocast + GradScaler) training of a small MLP with DDP on 2 CPU ranks.
Each rank takes its own half of a synthetic regression set. A first job trains 4 steps and
checkpoints; the job is then restarted from the checkpoint and trains 4 more steps."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

TOTAL_STEPS = 8
BATCH = 8  # per rank


def make_data(n=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = 2.0 * (x @ torch.randn(8, 1, generator=g))
    return x, y


def make_model():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def run_job(ckpt_path, stop_step):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data()
    xs, ys = x[rank::world], y[rank::world]  # this rank's shard

    torch.manual_seed(0)
    model = DDP(make_model())
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    scaler = torch.amp.GradScaler("cpu")

    start = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        start = ckpt["step"]
        if rank == 0:
            print(f"resumed at step {start}")

    for step in range(start, stop_step):
        j = (step % (len(xs) // BATCH)) * BATCH
        xb, yb = xs[j:j + BATCH], ys[j:j + BATCH]
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(xb)
        loss = nn.functional.mse_loss(out.float(), yb)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} scale {scale:.0f}")

    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                    "scaler": scaler.state_dict(), "step": stop_step}, ckpt_path)
    dist.barrier()
    return model, opt


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    box = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_path = os.path.join(box[0], "ckpt.pt")

    run_job(ckpt_path, stop_step=4)                       # first job
    model, opt = run_job(ckpt_path, stop_step=TOTAL_STEPS)  # restarted job

    out = os.environ.get("FINAL_STATE_DIR")
    if out:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()},
                   os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
