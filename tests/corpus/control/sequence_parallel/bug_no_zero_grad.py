"""Sequence parallel MLP: the input is sharded along dim 0 across ranks, all-gathered for the
column-parallel layer and reduce-scattered after the row-parallel one. 1-D CPU mesh.

Run: torchrun --standalone --nproc-per-node 2 correct.py
"""
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)
logger = logging.getLogger(__name__)

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
    device_mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    rank = device_mesh.get_rank()
    rank_log(rank, f"Device Mesh created: {device_mesh=}")

    model = ToyModel()

    sp_model = parallelize_module(
        module=model,
        device_mesh=device_mesh,
        parallelize_plan={
            "in_proj": ColwiseParallel(input_layouts=Shard(0)),
            "out_proj": RowwiseParallel(output_layouts=Shard(0)),
        },
    )

    lr = 0.02
    optimizer = torch.optim.AdamW(sp_model.parameters(), lr=lr, foreach=True)

    num_iters = 12
    for i in range(num_iters):
        # for SP each rank holds its own slice of the sequence: inputs differ per rank
        inp = torch.rand(20, 10)
        output = sp_model(inp)
        loss = F.mse_loss(output, inp @ TEACHER)
        loss.backward()
        optimizer.step()
        rank_log(rank, f"Sequence Parallel iter {i} loss {loss.item():.4f}")

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
