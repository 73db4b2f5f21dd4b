"""An ordinary DDP training script, as torchrun runs it: `torchrun --nproc-per-node 2 train_ddp.py`.
`ddp-lab watch examples/scripts/train_ddp.py` runs it unchanged, with watch's checks attached.
Its data: a DistributedSampler over a synthetic regression set; its log: the mean loss over
every rank's samples (all_reduce of the sums and the counts)."""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--checkpoint", help="save the trained weights here (rank 0)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same data and initial weights on every rank
    x = torch.randn(args.samples, 16)
    data = TensorDataset(x, x.sum(1, keepdim=True).sin())
    model = DDP(nn.Sequential(nn.Linear(16, args.width), nn.ReLU(), nn.Linear(args.width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    steps = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if steps == 1:  # timed from the second step: the first builds
                start = time.perf_counter()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)))])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: loss {(total[0] / total[1]).item():.4f}")
    if rank == 0:
        print(f"{steps - 1} steps in {time.perf_counter() - start:.3f} s")
    if args.checkpoint and rank == 0:
        torch.save(model.module.state_dict(), args.checkpoint)  # the plain module's keys
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
