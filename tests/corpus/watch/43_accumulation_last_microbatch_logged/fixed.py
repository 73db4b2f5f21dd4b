"""Train a tiny next-token model on 2 ranks (DDP, gloo), 4 micro-batches a step, printing the loss.
Fix: the print shows loss_accum, the step's loss summed over the micro-batches and averaged over
the ranks. Cites https://github.com/karpathy/nanoGPT/pull/207 and karpathy/llm.c#551."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 4
VOCAB = 11


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    for it in range(3):
        loss_accum = torch.zeros(())
        for micro in range(ACCUM):
            tokens = torch.randint(0, VOCAB, (4, 9), generator=g)
            model.require_backward_grad_sync = micro == ACCUM - 1
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss = loss / ACCUM
            loss_accum += loss.detach()
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(loss_accum)
        loss_accum /= dist.get_world_size()
        if rank == 0:
            print(f"iter {it}: loss {loss_accum.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
