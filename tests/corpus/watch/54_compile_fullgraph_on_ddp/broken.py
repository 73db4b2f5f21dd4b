"""Train a small MLP on 2 CPU ranks, compiled with fullgraph=True.
Bug: fullgraph=True is given to the DDP wrapper, whose own forward breaks the graph: the first forward fails.
Modelled on https://github.com/mlcommons/algorithmic-efficiency/issues/487 and https://github.com/pytorch/pytorch/issues/107639."""
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
    model = torch.compile(DDP(Net()), backend="eager", fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(3):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
