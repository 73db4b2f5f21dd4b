"""An ordinary compiled DDP training script, as torchrun runs it:
`torchrun --nproc-per-node 2 train_compiled.py`. `ddp-lab watch examples/scripts/train_compiled.py`
runs it unchanged. torch.compile with the aot_eager backend (dynamo's graphs and guards, eager
kernels: no C++ compiler needed); DDP wraps the compiled module's original."""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--backend", default="aot_eager")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, args.width), nn.GELU(), nn.Linear(args.width, 4))
    model = torch.compile(DDP(net), backend=args.backend)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    torch.manual_seed(1 + rank)
    for step in range(args.steps):
        if step == 1:  # timed from the second step: the first builds (and compiles)
            start = time.perf_counter()
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 2 == 0:
            print(f"step {step}: rank 0's loss {loss.item():.4f}")
    if rank == 0:
        print(f"{args.steps - 1} steps in {time.perf_counter() - start:.3f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
