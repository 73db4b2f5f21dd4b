"""Train a small MLP with FSDP2 (fully_shard) on 2 CPU ranks; rank 0 then saves the model for inference with torch.save.
Fix: every rank gathers the full state dict (get_model_state_dict, full_state_dict=True), rank 0 saves plain full tensors.
Modelled on https://github.com/pytorch/pytorch/issues/136336 and https://github.com/Lightning-AI/pytorch-lightning/issues/17702."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        with tempfile.TemporaryDirectory() as folder:
            torch.save(state, os.path.join(folder, "model.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
