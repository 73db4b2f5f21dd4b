"""Train a small MLP under torch.compile(DDP(...)) on 2 CPU ranks; forward scales by a warm-up factor of the step count.
Fix: the step lives in a buffer filled in place, an input of the compiled graph: forward compiles once.
Modelled on https://github.com/pytorch/pytorch/issues/128319 and https://github.com/pytorch/pytorch/issues/115711."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

WARMUP = 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)
        self.register_buffer("step", torch.zeros(()), persistent=False)

    def forward(self, x):
        scale = torch.clamp((self.step + 1) / WARMUP, max=1.0)
        return self.fc2(torch.relu(self.fc1(x))) * scale


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.compile(DDP(Net()), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        model.module.step.fill_(step)
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
