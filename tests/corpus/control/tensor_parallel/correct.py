"""Megatron-style tensor parallel MLP: ColwiseParallel then RowwiseParallel, on a 1-D CPU mesh.

Run: torchrun --standalone --nproc-per-node 2 correct.py
"""
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)
logger = logging.getLogger(__name__)

# the function the toy model learns (fixed, identical on every rank)
TEACHER = torch.randn(10, 5, generator=torch.Generator().manual_seed(3)) / 10 ** 0.5


def rank_log(rank, msg):
    if rank == 0:
        logger.info(msg)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def main():
    world_size = int(os.environ["WORLD_SIZE"])
    device_mesh = init_device_mesh("cpu", (world_size,))
    rank = device_mesh.get_rank()
    rank_log(rank, f"Device Mesh created: {device_mesh=}")

    tp_model = ToyModel()

    tp_model = parallelize_module(
        module=tp_model,
        device_mesh=device_mesh,
        parallelize_plan={"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()},
    )

    lr = 0.02
    optimizer = torch.optim.AdamW(tp_model.parameters(), lr=lr, foreach=True)

    num_iters = 12
    for i in range(num_iters):
        # every TP rank must see the same input: seed like a shared dataloader would
        torch.manual_seed(i)
        inp = torch.rand(20, 10)
        output = tp_model(inp)
        loss = F.mse_loss(output, inp @ TEACHER)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rank_log(rank, f"Tensor Parallel iter {i} loss {loss.item():.4f}")

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
