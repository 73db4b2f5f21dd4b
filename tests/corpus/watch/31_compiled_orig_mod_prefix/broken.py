"""Compile a small MLP, wrap it in DDP, train on 2 CPU ranks; rank 0 saves {"model", "optimizer", "step"}.
Bug: raw_model = model.module is the compiled wrapper, so the saved keys carry "_orig_mod.": resuming into a plain model fails.
Modelled on https://github.com/karpathy/nanoGPT/issues/325 and https://github.com/pytorch/pytorch/issues/101107."""
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
    net = Net()
    model = torch.compile(net, backend="eager")
    model = DDP(model)
    raw_model = model.module
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    for step in range(3):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = {"model": raw_model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            torch.save(checkpoint, os.path.join(folder, "ckpt.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
