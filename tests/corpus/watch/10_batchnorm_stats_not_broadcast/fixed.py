"""Train a small BatchNorm regressor with DDP on 2 CPU ranks, then evaluate each rank's share.
Fix: DDP's default buffer sync: every forward starts from rank 0's running stats, on every rank.
Modelled on https://github.com/facebookresearch/moco/issues/41 and https://github.com/huggingface/pytorch-image-models/issues/110."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def batch(gen, rank):
    x = torch.randn(16, 8, generator=gen) + rank  # each rank's shard has its own statistics
    return x, x.sum(dim=1, keepdim=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Net())  # DDP broadcasts rank 0's buffers before every forward
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for step in range(4):
        x, y = batch(gen, rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()  # evaluation uses the running stats
    with torch.no_grad():
        x, y = batch(gen, rank)
        val = nn.functional.mse_loss(model(x), y)
    dist.all_reduce(val)
    if rank == 0:
        print(f"validation loss {val.item() / dist.get_world_size():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
