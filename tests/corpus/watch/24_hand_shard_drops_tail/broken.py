"""Train a small regressor with DDP on 2 CPU ranks; each rank takes its own contiguous slice of 45 samples.
Bug: the slice size is len // world_size, so the tail (here sample 44) is on no rank, in every epoch.
Modelled on https://github.com/modelscope/ms-swift/pull/9907 and https://github.com/lhotse-speech/lhotse/pull/695."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


def load_dataset():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(45, 3, generator=g)
    return TensorDataset(x, 2 * x[:, :1] - x[:, 1:2])


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    full = load_dataset()
    per_rank = len(full) // world
    shard = Subset(full, range(rank * per_rank, (rank + 1) * per_rank))
    loader = DataLoader(shard, batch_size=8, shuffle=True)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
