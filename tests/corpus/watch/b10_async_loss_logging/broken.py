"""Train a small two-layer regressor with DDP on 2 CPU ranks: 80 synthetic samples,
DistributedSampler, 8 samples per rank per step, 2 epochs, SGD.
Rank 0 logs the loss averaged over all ranks at every step."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n=80):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    w = torch.randn(6, 1, generator=g)
    y = x @ w + 0.3 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = make_dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)

    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()

            log_loss = loss.detach().clone()
            handle = dist.all_reduce(log_loss, op=dist.ReduceOp.SUM, async_op=True)
            mean_loss = log_loss.item() / world_size
            opt.step()
            handle.wait()

            if rank == 0:
                print(f"epoch {epoch} step {step} loss {mean_loss:.6f}")
            step += 1

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
