"""Train a small embedding network with a CosFace-style margin loss (learned class centres)
under DDP on 2 CPU ranks, 3 epochs over a synthetic 4-class dataset."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class CosFaceLoss(nn.Module):
    def __init__(self, emb_dim, num_classes, s=8.0, m=0.2):
        super().__init__()
        self.W = nn.Parameter(torch.randn(num_classes, emb_dim) * 0.1)
        self.s, self.m = s, m

    def forward(self, emb, labels):
        cos = F.normalize(emb) @ F.normalize(self.W).t()
        logits = self.s * (cos - self.m * F.one_hot(labels, cos.size(1)))
        return F.cross_entropy(logits, labels)


def make_data(n=48):
    g = torch.Generator().manual_seed(3)
    labels = torch.arange(n) % 4
    centres = torch.randn(4, 10, generator=g)
    x = centres[labels] + 0.5 * torch.randn(n, 10, generator=g)
    return TensorDataset(x, labels)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 8)))
    criterion = DDP(CosFaceLoss(8, 4))
    opt = torch.optim.Adam(list(model.parameters()) + list(criterion.parameters()), lr=0.01)
    ds = make_data()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = criterion(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    if os.environ.get("STATE_DUMP_DIR"):
        state = {"model": model.module.state_dict(), "criterion": criterion.state_dict()}
        torch.save(state, os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
