"""Semi-supervised training of a small MLP classifier with DDP on CPU ranks: a cross-entropy
loss on a labelled set (DistributedSampler) plus a consistency term that asks the embedding of
an unlabelled sample and of a noisy copy of it to agree. A checkpoint is written at the end."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(nn.Module):
    def __init__(self, d_in=6, emb=16, n_cls=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, emb))
        self.classifier = nn.Linear(emb, n_cls)

    def embed(self, x):
        return F.normalize(self.encoder(x), dim=1)

    def forward(self, x):
        return self.classifier(self.embed(x))


def labelled_set(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    ds = labelled_set()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=12, sampler=sampler)
    g = torch.Generator().manual_seed(1234)
    unlabelled = torch.randn(world * 64, 6, generator=g)[rank::world]
    noise = torch.Generator().manual_seed(99 + rank)

    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            u = unlabelled[(step * 8) % 64:(step * 8) % 64 + 8]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            u_noisy = u + 0.1 * torch.randn(u.shape, generator=noise)
            cons = 0.5 * F.mse_loss(model.module.embed(u), model.module.embed(u_noisy))
            cons.backward()
            opt.step()
            step += 1
        if rank == 0:
            print(f"epoch {epoch} step {step} ce {loss.item():.4f} consistency {cons.item():.5f}")

    if rank == 0:
        ckpt_dir = tempfile.mkdtemp()
        torch.save(model.module.state_dict(), os.path.join(ckpt_dir, "net.pt"))
        shutil.rmtree(ckpt_dir)
    out_dir = os.environ.get("TRAIN_STATS_DIR")
    if out_dir:
        torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
