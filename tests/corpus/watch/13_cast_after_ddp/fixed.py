"""Train a small regressor in bfloat16 with DDP on 2 CPU ranks.
Fix: the model is cast before DDP(...), which then builds its gradient buckets for the bf16 parameters.
Modelled on https://github.com/radixark/miles/pull/992 and https://discuss.pytorch.org/t/preferred-way-of-loading-checkpoint-with-ddp-training/187470."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model = model.to(torch.bfloat16)  # train in bf16
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(4):
        x = torch.randn(16, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x.to(torch.bfloat16)).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
