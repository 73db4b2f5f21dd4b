"""An ordinary FSDP2 training script, as torchrun runs it: `torchrun --nproc-per-node 2 train_fsdp2.py`.
`ddp-lab watch examples/scripts/train_fsdp2.py` runs it unchanged, with watch's checks attached.
Each block is one fully_shard unit, the root another; the loss logged is the global mean."""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.ff(self.norm(x)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--width", type=int, default=32)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank: FSDP2 does not broadcast them
    model = nn.Sequential(nn.Linear(8, args.width), Block(args.width), Block(args.width),
                          nn.Linear(args.width, 1))
    for block in (model[1], model[2]):
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)  # each rank draws its own batches
    for step in range(args.steps):
        if step == 1:  # timed from the second step: the first builds (and compiles)
            start = time.perf_counter()
        x = torch.randn(8, 8)
        loss = nn.functional.mse_loss(model(x), x[:, :1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM)
        if dist.get_backend() != "nccl":
            mean /= dist.get_world_size()  # gloo has no AVG: the sum over ranks, divided
        if rank == 0:
            print(f"step {step}: loss {mean.item():.4f}")
    if rank == 0:
        print(f"{args.steps - 1} steps in {time.perf_counter() - start:.3f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
