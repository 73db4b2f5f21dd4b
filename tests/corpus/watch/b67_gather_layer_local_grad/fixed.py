"""Train a small contrastive (SimCLR-style) encoder with DDP on 2 CPU ranks: two noisy views of
each seeded sample, InfoNCE of each rank's anchors against the views gathered from every rank,
DataLoader + DistributedSampler, SGD, 8 steps."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 32


def make_pairs(n=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 12, generator=g)
    view1 = base + 0.3 * torch.randn(n, 12, generator=g)
    view2 = base + 0.3 * torch.randn(n, 12, generator=g)
    return TensorDataset(view1, view2)


class GatherLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        all_grads = torch.stack(grads)
        dist.all_reduce(all_grads)
        return all_grads[dist.get_rank()]


def info_nce(z1, z2, temperature=0.2):
    z1 = F.normalize(z1, dim=1)
    z2 = F.normalize(z2, dim=1)
    keys = torch.cat(GatherLayer.apply(z2), dim=0)
    logits = z1 @ keys.t() / temperature
    labels = torch.arange(z1.size(0)) + dist.get_rank() * z1.size(0)
    return F.cross_entropy(logits, labels)


def build_encoder():
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(build_encoder())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = make_pairs()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH // world, sampler=sampler, drop_last=True)
    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for v1, v2 in loader:
            z1, z2 = model(torch.cat([v1, v2])).chunk(2)
            loss = info_nce(z1, z2)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            step += 1
    out = os.environ.get("RUN_EXPORT_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
