"""Train a small MLP under torch.compile(DDP(...)) on 2 CPU ranks; forward scales by a warm-up factor of the step count.
Bug: the loop stores the step as an int attribute of the module, a constant of the compiled graph: it recompiles every step.
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
        self.step = 0

    def forward(self, x):
        scale = min(1.0, (self.step + 1) / WARMUP)
        return self.fc2(torch.relu(self.fc1(x))) * scale


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.compile(DDP(Net()), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        model.module.step = step
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
