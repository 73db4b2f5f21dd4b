"""Fine-tune a small MLP classifier with DDP on CPU ranks in two phases: first only the head
trains on top of the frozen backbone, then the backbone is unfrozen and trained too with a
lower learning rate. Each rank reads its own strided subset of a synthetic dataset."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


class Net(nn.Module):
    def __init__(self, d_in=8, hidden=24, n_cls=4):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(),
                                      nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, n_cls)

    def forward(self, x):
        return self.head(self.backbone(x))


def make_dataset(n=200):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() * 2 + (x[:, 1] * x[:, 2] > 0).long()
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = Net()
    for p in net.backbone.parameters():
        p.requires_grad = False
    model = DDP(net)
    opt = torch.optim.Adam(net.head.parameters(), lr=1e-2)

    ds = make_dataset()
    loader = DataLoader(Subset(ds, range(rank, len(ds), world)), batch_size=20, shuffle=True,
                        generator=torch.Generator().manual_seed(rank))
    for epoch in range(2):
        if epoch == 1:
            for p in net.backbone.parameters():
                p.requires_grad = True
            opt.add_param_group({"params": list(net.backbone.parameters()), "lr": 2e-3})
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")

    out_dir = os.environ.get("TRAIN_STATS_DIR")
    if out_dir:
        torch.save(net.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
