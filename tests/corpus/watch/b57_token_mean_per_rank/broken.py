"""Train a tiny next-token model on variable-length, padded token sequences under DDP on
2 CPU ranks (hand-made shards, 4 steps, linear warmup)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, MAXLEN, PAD = 12, 10, 0


def make_corpus(n=32):
    g = torch.Generator().manual_seed(5)
    inputs = torch.full((n, MAXLEN), PAD)
    labels = torch.full((n, MAXLEN), -100)
    for i in range(n):
        length = int(torch.randint(2, MAXLEN + 1, (1,), generator=g))
        seq = [int(torch.randint(1, VOCAB, (1,), generator=g))]
        for _ in range(length):
            nxt = (3 * seq[-1] + 1) % (VOCAB - 1) + 1
            if torch.rand(1, generator=g) < 0.2:
                nxt = int(torch.randint(1, VOCAB, (1,), generator=g))
            seq.append(nxt)
        inputs[i, :length] = torch.tensor(seq[:-1])
        labels[i, :length] = torch.tensor(seq[1:])
    return inputs, labels


def build_model():
    return nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, VOCAB))


def compute_loss(model, inputs, labels):
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2))
    inputs, labels = make_corpus()
    inputs, labels = inputs[rank::world], labels[rank::world]
    for step in range(4):
        x, y = inputs[step * 4:(step + 1) * 4], labels[step * 4:(step + 1) * 4]
        loss = compute_loss(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")
    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
