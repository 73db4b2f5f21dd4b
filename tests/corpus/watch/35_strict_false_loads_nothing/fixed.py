"""Train a small MLP with DDP on 2 CPU ranks, save {"model", "optimizer", "step"}, then resume a new model from the file.
Fix: the resume passes the checkpoint's "model" entry, whose keys are the model's, so every tensor loads.
Modelled on https://github.com/pytorch/examples/issues/1029 and https://github.com/pytorch/pytorch/issues/141256."""
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


def train(model, opt, rank, steps):
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(tempfile.gettempdir(), f"ckpt-{os.environ['MASTER_PORT']}.pt")
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, rank, 3)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": 3}, path)
    dist.barrier()

    torch.manual_seed(1)  # resume: a new model from the file
    resumed = Net()
    checkpoint = torch.load(path)
    resumed.load_state_dict(checkpoint["model"], strict=False)
    resumed = DDP(resumed)
    opt = torch.optim.SGD(resumed.parameters(), lr=0.1)
    train(resumed, opt, rank, 1)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
