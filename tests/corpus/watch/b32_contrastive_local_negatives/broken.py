"""CLIP-style dual-encoder pretraining with DDP on 2 CPU ranks: 64 synthetic (a, b) pairs,
global batch 16, symmetric InfoNCE with in-batch negatives at temperature 0.1, 2 epochs."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 16
TEMPERATURE = 0.1


class DualEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc_a = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))
        self.enc_b = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, a, b):
        return F.normalize(self.enc_a(a), dim=-1), F.normalize(self.enc_b(b), dim=-1)


def make_pairs(n=64):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(n, 12, generator=g)
    mix = torch.randn(12, 12, generator=g) / 12 ** 0.5
    b = a @ mix + 0.3 * torch.randn(n, 12, generator=g)
    return TensorDataset(a, b)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    model = DDP(DualEncoder())
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    ds = make_pairs()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for a, b in loader:
            za, zb = model(a, b)
            logits = za @ zb.t() / TEMPERATURE
            labels = torch.arange(za.shape[0])
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} contrastive loss {loss.item():.4f}")

    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
