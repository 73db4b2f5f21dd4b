"""Train a small bag-of-tokens sequence classifier with DDP on 2 CPU ranks: variable-length token
sequences, DistributedSampler, the DDP model compiled with torch.compile (aot_eager backend),
AdamW, 2 epochs of 5 steps."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

VOCAB, PAD = 64, 0


class TokenDataset(Dataset):
    def __init__(self, n=40, seed=0):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(2, 64, (n,), generator=g)
        self.seqs = [torch.randint(1, VOCAB, (int(l),), generator=g) for l in lengths]
        self.labels = [int(s.float().mean() > VOCAB / 2) for s in self.seqs]

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i], self.labels[i]


def collate(batch):
    seqs, labels = zip(*batch)
    tokens = nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=PAD)
    return tokens, torch.tensor(labels)


class BagOfTokens(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.head = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, tokens):
        mask = (tokens != PAD).unsqueeze(-1).float()
        pooled = (self.emb(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(BagOfTokens())
    model = torch.compile(model, backend="aot_eager", dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    ds = TokenDataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=collate)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for tokens, labels in loader:
            loss = F.cross_entropy(model(tokens), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                print(f"epoch {epoch} seq_len {tokens.shape[1]} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
