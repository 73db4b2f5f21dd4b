"""Adapt a small two-block model to a 3-class task under FSDP2 (fully_shard) on 2 CPU ranks.
Fix: the new head is set before fully_shard(model), which then shards it and reduces its gradients.
Modelled on https://github.com/meta-pytorch/torchtune/pull/2714 and https://github.com/huggingface/transformers/issues/40382."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    model.head = nn.Linear(8, 3)  # the new task has 3 classes
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
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
