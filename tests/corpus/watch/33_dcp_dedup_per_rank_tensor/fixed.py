"""Train a DDP model on 2 CPU ranks, each rank also keeping its own rows of a hand-sharded table; save both with dcp.save.
Fix: the shard is a DTensor sharded on dim 0 over the ranks, so DCP writes every rank's rows.
Modelled on https://github.com/pytorch/pytorch/issues/120356 and https://github.com/pytorch/pytorch/issues/146566."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    table = torch.zeros(4, 8)  # this rank's 4 rows of an 8-row table
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        table += x  # each rank updates its own rows
        loss = nn.functional.cross_entropy(model(x + table), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    folder = os.path.join(tempfile.gettempdir(), f"ckpt-{os.environ['MASTER_PORT']}")
    shard = DTensor.from_local(table, mesh, [Shard(0)])
    dcp.save({"model": model.module.state_dict(), "table": shard}, checkpoint_id=folder)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
