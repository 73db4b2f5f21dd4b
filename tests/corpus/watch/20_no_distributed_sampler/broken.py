"""Train a small regressor with DDP on 2 CPU ranks from a TensorDataset of 32 samples, 2 epochs.
Bug: the DataLoader has no DistributedSampler, so every rank trains on the whole dataset each epoch.
Modelled on https://github.com/PatrickHua/SimSiam/issues/16 and https://github.com/karpathy/llama2.c/issues/522."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(n=32):
    g = torch.Generator().manual_seed(0)  # the same 32 samples on every rank
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = make_dataset()
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
