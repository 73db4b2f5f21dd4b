"""Train a small classifier with DDP on 2 CPU ranks, a shuffling DistributedSampler, 3 epochs.
Fix: sampler.set_epoch(epoch) at the start of each epoch, before the loop creates the iterator.
Modelled on https://github.com/pytorch/pytorch/issues/31771 and https://github.com/lucidrains/DALLE-pytorch/pull/230."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class PointsDataset(Dataset):
    def __init__(self, n=32):
        g = torch.Generator().manual_seed(1)
        self.points = torch.randn(n, 2, generator=g)
        self.labels = (self.points[:, 0] > 0).long()

    def __len__(self):
        return len(self.points)

    def __getitem__(self, i):
        return self.points[i], self.labels[i]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    dataset = PointsDataset()
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for points, labels in loader:
            loss = nn.functional.cross_entropy(model(points), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
