"""Adapt a small classifier to a 3-class task with DDP on 2 CPU ranks: a new head, then train.
Bug: the head is replaced after DDP(...): DDP's gradient hooks stay on the old head, the new one is never all-reduced.
Modelled on https://github.com/pytorch/pytorch/issues/12603 and https://github.com/pytorch/vision/issues/2505."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Classifier(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Classifier()
    model = DDP(model, find_unused_parameters=True)
    model.module.head = nn.Linear(16, 3)  # the new task has 3 classes
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(4):
        x = torch.randn(16, 8, generator=gen)
        y = torch.randint(0, 3, (16,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
