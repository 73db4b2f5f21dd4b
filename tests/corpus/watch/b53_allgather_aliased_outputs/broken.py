"""Train a small 3-class MLP classifier with DDP on 2 CPU ranks (bfloat16 autocast on the CPU),
then evaluate: each rank scores its half of a 48-sample validation set, the predictions and labels
are gathered and rank 0 prints the accuracy and per-class recall."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_blobs(seed, n):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centers = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    x = centers[y] + 1.2 * torch.randn(n, 2, generator=g)
    return TensorDataset(x, y)


def gather_tensor(t):
    out = [torch.zeros_like(t)] * dist.get_world_size()
    dist.all_gather(out, t)
    return torch.cat(out)


@torch.no_grad()
def evaluate(model, loader):
    preds, labels = [], []
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        preds.append(logits.float().argmax(dim=1))
        labels.append(y)
    preds = gather_tensor(torch.cat(preds))
    labels = gather_tensor(torch.cat(labels))
    metrics = {"acc": (preds == labels).float().mean().item()}
    for c in range(3):
        metrics[f"recall_{c}"] = (preds[labels == c] == c).float().mean().item()
    return metrics


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3)))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)

    train = make_blobs(0, 64)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=8, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} train loss {loss.item():.4f}")

    val = make_blobs(1, 48)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    metrics = evaluate(model, val_loader)
    if rank == 0:
        print("val " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if os.environ.get("RUN_OUT"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["RUN_OUT"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
