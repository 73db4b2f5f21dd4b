"""Train a small 3-class classifier with DDP on 2 CPU ranks, then evaluate it on a
held-out set stored as 3 shards (9, 6 and 6 samples), the shards dealt out to the ranks
in turn; rank 0 prints the validation accuracy."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_data(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 1.0).long()
    return x, y


def gather_predictions(preds, labels, world_size):
    n_local = torch.tensor([preds.numel()])
    sizes = [torch.zeros_like(n_local) for _ in range(world_size)]
    dist.all_gather(sizes, n_local)
    max_n = int(max(s.item() for s in sizes))

    padded_preds = torch.zeros(max_n, dtype=preds.dtype)
    padded_labels = torch.zeros(max_n, dtype=labels.dtype)
    padded_preds[: preds.numel()] = preds
    padded_labels[: labels.numel()] = labels

    all_preds = [torch.zeros_like(padded_preds) for _ in range(world_size)]
    all_labels = [torch.zeros_like(padded_labels) for _ in range(world_size)]
    dist.all_gather(all_preds, padded_preds)
    dist.all_gather(all_labels, padded_labels)
    return torch.cat(all_preds), torch.cat(all_labels)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()

    x_train, y_train = make_data(0, 64)
    val_shards = [make_data(100 + k, n) for k, n in enumerate([9, 6, 6])]

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3)))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)

    # each rank trains on its own half of the training set
    xs, ys = x_train[rank::world_size], y_train[rank::world_size]
    for step in range(8):
        i = (step % 4) * 8
        loss = nn.functional.cross_entropy(model(xs[i:i + 8]), ys[i:i + 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")

    my_shards = val_shards[rank::world_size]
    xv = torch.cat([s[0] for s in my_shards])
    yv = torch.cat([s[1] for s in my_shards])
    model.eval()
    with torch.no_grad():
        preds = model(xv).argmax(dim=1)
    all_preds, all_labels = gather_predictions(preds, yv, world_size)
    correct = (all_preds == all_labels).sum().item()
    accuracy = correct / all_labels.numel()
    if rank == 0:
        print(f"val accuracy {accuracy:.4f} ({correct}/{all_labels.numel()})")

    if os.environ.get("RUN_STATE_OUT"):
        torch.save(model.module.state_dict(), f"{os.environ['RUN_STATE_OUT']}.rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
