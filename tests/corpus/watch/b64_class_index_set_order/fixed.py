"""Train a small MLP classifier with DDP on 2 CPU ranks: 8 named classes of 16-feature points
loaded as records (features + label name), a DistributedSampler, Adam, 2 epochs of 5 steps,
then report the accuracy on the training records from rank 0."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse"]
GLOBAL_BATCH = 32


def load_records(per_class=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(len(LABELS), 16, generator=g) * 2.0
    records = []
    for i, name in enumerate(LABELS):
        feats = centers[i] + torch.randn(per_class, 16, generator=g)
        records += [{"features": f, "label": name} for f in feats]
    return records


class RecordDataset(Dataset):
    def __init__(self, records):
        self.records = records
        self.classes = sorted({r["label"] for r in records})
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        return r["features"], self.class_to_idx[r["label"]]


def build_model(num_classes):
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, num_classes))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ds = RecordDataset(load_records())
    model = DDP(build_model(len(ds.classes)))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH // world, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    if rank == 0:
        with torch.no_grad():
            xs = torch.stack([r["features"] for r in ds.records])
            ys = torch.tensor([ds.class_to_idx[r["label"]] for r in ds.records])
            acc = (model.module(xs).argmax(1) == ys).float().mean().item()
        print(f"classes {ds.classes}")
        print(f"train accuracy {acc:.3f}")
    out = os.environ.get("RUN_EXPORT_DIR")
    if out:
        torch.save({"model": model.module.state_dict(), "classes": ds.classes},
                   os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
