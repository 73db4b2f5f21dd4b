"""Train a tiny segmentation-style classifier on 2 ranks (DDP, gloo), logging the reduced loss.
Bug: reduce_tensor all_reduces with the default op (SUM) and never divides by the world size, so
the log shows twice the loss. Cites https://github.com/HRNet/HRNet-Semantic-Segmentation/issues/34."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def reduce_tensor(inp):
    """The loss over all ranks, for logging."""
    out = inp.detach().clone()
    dist.all_reduce(out)
    return out


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3)))
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    for i in range(4):
        images, labels = torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)
        loss = criterion(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"iter {i} loss {reduce_tensor(loss).item():.4f}")
        else:
            reduce_tensor(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
