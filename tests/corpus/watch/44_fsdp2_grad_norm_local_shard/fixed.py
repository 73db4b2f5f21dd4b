"""Train a tiny MLP under FSDP2 (fully_shard, gloo, 2 ranks), logging the gradient norm each step.
Fix: the norm is taken over the DTensor gradients themselves: get_total_norm reduces the shards'
norms (torch 2.13: nn/utils/clip_grad.py:105), the same on every rank. Cites https://github.com/pytorch/pytorch/issues/170862 and radixark/miles_diffusion#35."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    for step in range(3):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        print(f"rank {rank} step {step} grad_norm {grad_norm.item():.4f}")
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
