"""Train a tiny VQ autoencoder (encoder -> 16-entry codebook -> decoder) with DDP on 2 CPU ranks.
Each rank reads its own slice of 128 random 8-d vectors; codes that go unused are refreshed
from encoder outputs every other step, as in VQ-VAE training recipes. 8 optimizer steps."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Quantizer(nn.Module):
    def __init__(self, num_codes=16, dim=4):
        super().__init__()
        self.codebook = nn.Parameter(torch.randn(num_codes, dim))

    def forward(self, z):
        idx = torch.cdist(z, self.codebook).argmin(dim=1)
        q = self.codebook[idx]
        vq_loss = F.mse_loss(q, z.detach()) + 0.25 * F.mse_loss(z, q.detach())
        return z + (q - z).detach(), vq_loss, idx


class VQAutoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.quantizer = Quantizer()
        self.decoder = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x):
        z = self.encoder(x)
        q, vq_loss, idx = self.quantizer(z)
        return self.decoder(q), vq_loss, idx, z.detach()


@torch.no_grad()
def refresh_unused_codes(quantizer, usage, z, threshold=0.5):
    dead = usage < threshold
    n_dead = int(dead.sum())
    if n_dead:
        pick = torch.randint(0, z.shape[0], (n_dead,))
        quantizer.codebook.data[dead] = z[pick]
        usage[dead] = 1.0
    return n_dead


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = torch.randn(128, 8)
    shard = data[rank::world]

    model = DDP(VQAutoencoder())
    quantizer = model.module.quantizer
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    usage = torch.zeros(quantizer.codebook.shape[0])

    batch = 8
    for step in range(8):
        x = shard[step * batch:(step + 1) * batch]
        recon, vq_loss, idx, z = model(x)
        loss = F.mse_loss(recon, x) + vq_loss
        opt.zero_grad()
        loss.backward()
        opt.step()

        usage.mul_(0.8).add_(torch.bincount(idx, minlength=usage.numel()).float())
        refreshed = 0
        if step % 2 == 1:
            refreshed = refresh_unused_codes(quantizer, usage, z)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} refreshed {refreshed}")

    if os.environ.get("TRAIN_DUMP_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["TRAIN_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
