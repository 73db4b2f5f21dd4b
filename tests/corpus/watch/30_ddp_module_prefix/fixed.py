"""Train a small MLP with DDP on 2 CPU ranks, then rank 0 saves a checkpoint for inference.
Fix: it saves ddp_model.module.state_dict(), the plain model's keys, which a plain model loads.
Modelled on https://github.com/pytorch/pytorch/issues/41048 and https://github.com/NVIDIA/apex/issues/647."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp_model = DDP(Net())
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(ddp_model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.pt")
            torch.save(ddp_model.module.state_dict(), path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
