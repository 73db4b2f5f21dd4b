"""Train an encoder + head under DDP(torch.compile(..., fullgraph=True)) on 2 CPU ranks, recording a gradient norm by hook.
Fix: the hook goes on a tensor (the encoder's first weight), which fullgraph=True captures in one graph.
Modelled on https://github.com/pytorch/pytorch/issues/133303 and https://github.com/pytorch/pytorch/issues/146565."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

grad_norms = []


def record_grad_norm(grad):
    grad_norms.append(grad.norm().item())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net()
    net.encoder[0].weight.register_hook(record_grad_norm)
    model = DDP(torch.compile(net, backend="eager", fullgraph=True))
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
