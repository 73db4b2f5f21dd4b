"""Basic DDP, then the checkpoint pattern: rank 0 saves, barrier, every rank loads.

Run: torchrun --standalone --nproc-per-node 2 correct.py
"""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

# a fixed "teacher" the toy model learns to imitate (inputs stay random per process)
TEACHER = torch.randn(10, 5, generator=torch.Generator().manual_seed(7)) / 10 ** 0.5


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def train_steps(ddp_model, optimizer, n):
    loss_fn = nn.MSELoss()
    for _ in range(n):
        optimizer.zero_grad()
        inputs = torch.randn(20, 10)
        outputs = ddp_model(inputs)
        labels = inputs @ TEACHER
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
    return loss.item()


def demo_basic(rank):
    model = ToyModel()
    ddp_model = DDP(model)
    optimizer = optim.SGD(ddp_model.parameters(), lr=1.0)
    loss = train_steps(ddp_model, optimizer, 12)
    if rank == 0:
        print(f"basic: last loss {loss:.4f}")


def demo_checkpoint(rank, ckpt_dir):
    model = ToyModel()
    ddp_model = DDP(model)
    optimizer = optim.SGD(ddp_model.parameters(), lr=1.0)
    train_steps(ddp_model, optimizer, 4)

    checkpoint_path = os.path.join(ckpt_dir, "model.checkpoint")
    if rank == 0:
        # every process holds the same parameters, so one process saves
        torch.save(ddp_model.state_dict(), checkpoint_path)
    # the other processes load only once rank 0 has written the file
    dist.barrier()
    map_location = {"cpu": "cpu"}
    ddp_model.load_state_dict(torch.load(checkpoint_path, map_location=map_location))

    loss = train_steps(ddp_model, optimizer, 4)
    # nobody may still be reading the file when rank 0 removes it
    dist.barrier()
    if rank == 0:
        os.remove(checkpoint_path)
        print(f"checkpoint: last loss {loss:.4f}")


def main():
    env_dict = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    rank = int(env_dict["RANK"])
    if rank == 0:
        print(f"[{os.getpid()}] Initializing process group with: {env_dict}")
    dist.init_process_group(backend="gloo")
    if rank == 0:
        print(f"[{os.getpid()}]: world_size = {dist.get_world_size()}, rank = {dist.get_rank()}, "
              f"backend={dist.get_backend()}")

    demo_basic(rank)

    box = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    demo_checkpoint(rank, box[0])
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0], ignore_errors=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
