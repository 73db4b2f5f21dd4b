"""Train a small 3-class classifier on synthetic blobs with DDP (gloo), AdamW and a OneCycle
learning-rate schedule, 2 epochs over 80 samples; --batch-size is the batch each process loads."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EPOCHS = 2


def make_dataset(n=80):
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % 3
    centers = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
    x = centers[labels] + torch.randn(n, 4, generator=g)
    return TensorDataset(x, labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3)))
    opt = torch.optim.AdamW(model.parameters(), lr=args.max_lr, weight_decay=0.01)

    train_set = make_dataset()
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    total_steps = EPOCHS * (len(train_set) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.max_lr, total_steps=total_steps)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.3e}")
            sched.step()
            step += 1

    if os.environ.get("RUN_STATE_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["RUN_STATE_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
