"""Lesson 20's job as the script a user runs with torchrun (notebook 20, section 7:
`ddp-lab watch --reference --global-batch 16 examples/lesson20_per_rank_batch.py`): the lesson's regression (runs.dataset), a DistributedSampler, SGD at lr 0.05, and
`--batch-size 16` taken per rank, as it was on one process: at world size N each optimizer step
trains on 16 x N samples (the per-rank-batch bug of section 2). `--global` divides the global
batch by the world size instead (the fix). torchrun --nproc-per-node 2 examples/lesson20_per_rank_batch.py [--global]"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    from ddp_lab.lessons.l20_another_world_size.runs import LR, SEED, dataset, new_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16, help="samples per step")
    parser.add_argument("--global", dest="is_global", action="store_true",
                        help="--batch-size is the global batch: divide it by the world size")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    per_rank = args.batch_size // world if args.is_global else args.batch_size
    data = TensorDataset(*dataset())
    sampler = DistributedSampler(data, shuffle=True, seed=SEED)
    loader = DataLoader(data, batch_size=per_rank, sampler=sampler)
    model = DDP(new_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
