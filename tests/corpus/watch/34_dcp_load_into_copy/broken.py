"""Train a DDP model on 2 CPU ranks, save it with dcp.save, then resume a new model from that checkpoint with dcp.load.
Bug: the state given to dcp.load holds CPU copies of the new model's tensors: DCP fills the copies, the model keeps its random init.
Modelled on https://github.com/pytorch/pytorch/pull/138575 (dcp.load works in place) and https://github.com/pytorch/tutorials/issues/3067."""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def cpu_state(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def train(model, rank, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    folder = os.path.join(tempfile.gettempdir(), f"ckpt-{os.environ['MASTER_PORT']}")
    torch.manual_seed(0)
    model = DDP(make_model())
    train(model, rank, 3)
    dcp.save({"model": cpu_state(model.module)}, checkpoint_id=folder)

    torch.manual_seed(1)  # resume: a new model, its weights from the checkpoint
    resumed = make_model()
    state = {"model": cpu_state(resumed)}
    dcp.load(state, checkpoint_id=folder)
    resumed = DDP(resumed)
    train(resumed, rank, 1)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
