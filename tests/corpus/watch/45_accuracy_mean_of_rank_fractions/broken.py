"""Train a tiny classifier on 2 ranks (DDP, gloo), then evaluate each rank's shard of the validation set.
Bug: each rank's accuracy (a fraction) is all_reduced and divided by the world size, but the shards
differ in size (20 and 7 samples): an unweighted mean. Cites https://github.com/allenai/allennlp/issues/4347."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] + 0.8 * x[:, 1] > 0).long()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    x, y = make_data(64, rank)
    for step in range(3):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    val_x, val_y = make_data(27, 99)
    shard = slice(0, 20) if rank == 0 else slice(20, 27)  # the last shard is short
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for i in range(shard.start, shard.stop, 8):
            end = min(i + 8, shard.stop)
            correct += (model(val_x[i:end]).argmax(dim=1) == val_y[i:end]).sum().item()
            total += end - i
    acc = torch.tensor(correct / total)
    dist.all_reduce(acc)
    acc /= world
    if rank == 0:
        print(f"val accuracy {acc.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
