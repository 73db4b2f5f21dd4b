"""Train a small regressor that normalises its input by a running mean (a buffer) under FSDP2 on 2 CPU ranks.
Bug: the running mean is updated from the local batch only; FSDP2 never syncs buffers, so each rank normalises differently.
Modelled on https://github.com/pytorch/pytorch/issues/84053 and https://github.com/pytorch/torchtitan/issues/670."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("input_mean", torch.zeros(8))
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                batch_mean = x.mean(dim=0)
                self.input_mean.mul_(0.9).add_(0.1 * batch_mean)
        return self.body(x - self.input_mean)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for step in range(4):
        x = torch.randn(16, 8, generator=gen) + rank  # each rank's shard of the data differs
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
