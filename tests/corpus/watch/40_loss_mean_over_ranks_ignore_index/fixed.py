"""Train a tiny token tagger on 2 ranks (DDP, gloo) and print the loss averaged over ranks.
Fix: the ranks all_reduce loss x (real tokens) and the token count, and print their ratio; the ranks
hold different numbers of real tokens. Cites https://github.com/huggingface/transformers/issues/34242 and pytorch/torchtitan#1842."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PAD = -100


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(4, 6, 8, generator=g)
    y = torch.randint(0, 5, (4, 6), generator=g)
    y[:, 2 + 3 * rank:] = PAD  # rank 0's sentences are shorter: more padding
    return x, y


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x, y = batch(rank, step)
        loss = F.cross_entropy(model(x).view(-1, 5), y.view(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tokens = (y != PAD).sum()
        logged = torch.stack([loss.detach() * tokens, tokens.float()])
        dist.all_reduce(logged)
        if rank == 0:
            print(f"step {step} loss {(logged[0] / logged[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
