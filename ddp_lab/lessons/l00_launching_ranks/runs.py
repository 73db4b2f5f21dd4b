"""Lesson 00's per-rank functions: how ranks are launched and read, and the source document's own
example, run and fixed. Every function here runs on a rank (through `ddp_lab.launch`); none
starts a process.
"""
from __future__ import annotations

import difflib
import os

import torch
import torch.distributed as dist

from ...launching.rankinfo import rank_info


def all_reduce_hello() -> dict:
    """Each rank contributes rank + 1; after all_reduce every rank holds the same sum."""
    info = rank_info()
    t = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(t)
    print(f"rank {info.rank} of {info.world_size}: sum = {t.item():g}")
    return {"rank": info.rank, "sum": t.item()}


def train_on_shards(features_per_rank=(10, 10), steps: int = 3) -> dict:
    """A few DDP steps of a linear model; each rank reads its own shard of `features` columns.
    A shard with the wrong width fails on that rank only, while the other waits in DDP's
    gradient all-reduce."""
    info = rank_info()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(info.rank + 1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, features_per_rank[info.rank])
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses}


def metric_on_rank0_only(everyone: bool = False) -> dict:
    """Rank 0 all-reduces a metric to print it, then every rank meets at a barrier (the source
    document's cure for hangs). Unless `everyone`, rank 1 never joins the all_reduce."""
    info = rank_info()
    metric = torch.tensor([float(info.rank)])
    if everyone or info.rank == 0:
        dist.all_reduce(metric)
    if info.is_main:
        print(f"mean metric: {metric.item() / info.world_size:g}")
    dist.barrier()
    return {"metric": metric.item()}


def exit_mid_run(exit_rank: int | None = 1) -> dict:
    """Rank `exit_rank` leaves with os._exit(3) (as a library calling exit would) before the
    all_reduce; the other rank is left waiting for it."""
    info = rank_info()
    if info.rank == exit_rank:
        os._exit(3)
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"sum": t.item()}


# The example skeleton that ends the source document, verbatim but for the English translation
# added beside each of its two Chinese comments (the first says "explicitly specify the device").
SOURCE_EXAMPLE = '''\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def setup(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

class CustomModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(10, 10).to(f'cuda:{rank}')  # 显式指定设备 (explicitly specify the device)

def train(rank, world_size):
    setup(rank, world_size)
    model = CustomModule().cuda(rank)
    ddp_model = DDP(model, device_ids=[rank])
    optimizer = torch.optim.Adam(ddp_model.parameters())
    # 训练循环... (training loop...)
'''

_SETUP_BY_BACKEND = ('    backend = "nccl" if torch.cuda.is_available() else "gloo"\n'
                     '    dist.init_process_group(backend, rank=rank, world_size=world_size)\n')

# The device setup every rank needs on a GPU node, CPU/gloo otherwise. LOCAL_RANK is the GPU on
# this machine; `rank` counts every machine, so cuda:rank does not exist on a second node.
_SETUP_ON_LOCAL_DEVICE = '''\
    local_rank = int(os.environ.get("LOCAL_RANK", rank))  # torchrun sets it; mp.spawn: one machine
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # this process's GPU, for NCCL and every later .cuda()
        dist.init_process_group("nccl", rank=rank, world_size=world_size,
                                device_id=device)  # device_id= needs torch >= 2.3
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return device
'''

_TRAINING_LOOP = '''\
    device = setup(rank, world_size)
    model = CustomModule().to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-2)
    torch.manual_seed(rank)
    losses = []
    for step in range(20):
        x = torch.randn(16, 10, device=device)
        loss = (ddp_model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(rank, world_size):  # the entry point: train, then leave the group
    losses = train(rank, world_size)
    dist.destroy_process_group()
    return losses
'''

# Each fix, applied on top of the ones before it: (what it fixes, [(old text, new text), ...]).
SOURCE_FIXES = [
    ("import nn", [("import torch\n", "import os\n\nimport torch\nimport torch.nn as nn\n")]),
    ("choose the backend from the hardware: NCCL needs CUDA, gloo runs on CPU",
     [('    dist.init_process_group("nccl", rank=rank, world_size=world_size)\n', _SETUP_BY_BACKEND)]),
    ("build the module on the CPU; `rank` does not exist inside __init__",
     [("nn.Linear(10, 10).to(f'cuda:{rank}')  # 显式指定设备 (explicitly specify the device)",
       "nn.Linear(10, 10)")]),
    ("pick this machine's GPU from LOCAL_RANK (set_device, device_id=) or the CPU, move the whole "
     "module there once, give DDP device_ids only for CUDA, and write the training loop the "
     "document leaves out",
     [(_SETUP_BY_BACKEND, _SETUP_ON_LOCAL_DEVICE),
      ("    setup(rank, world_size)\n    model = CustomModule().cuda(rank)\n"
       "    ddp_model = DDP(model, device_ids=[rank])\n"
       "    optimizer = torch.optim.Adam(ddp_model.parameters())\n"
       "    # 训练循环... (training loop...)\n", _TRAINING_LOOP)]),
    ("give the module the forward pass it lacks",
     [("        self.layer = nn.Linear(10, 10)\n",
       "        self.layer = nn.Linear(10, 10)\n\n    def forward(self, x):\n        return self.layer(x)\n")]),
]


def source_example(fixes: int = 0) -> str:
    """The source document's example with the first `fixes` fixes applied."""
    code = SOURCE_EXAMPLE
    for _, edits in SOURCE_FIXES[:fixes]:
        for old, new in edits:
            assert old in code, f"fix does not apply: {old!r}"
            code = code.replace(old, new)
    return code


def source_fix_diff(k: int) -> str:
    """The k-th fix (1-based) as a unified diff."""
    before, after = source_example(k - 1), source_example(k)
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        f"step {k - 1}", f"step {k}", n=1))


def run_source_example(fixes: int = 0) -> dict:
    """Run the example (with `fixes` fixes) on this rank. The document has no entry point, so
    until the fixes add `main`, this calls `train(rank, world_size)` as `mp.spawn` would. The
    corrected model trains with Adam (lr 1e-2) for 20 steps to copy its input.

    `main` destroys the process group after `train` returns, once the DDP model is gone:
    destroying it while a gloo DDP model is still alive can deadlock the rank when the model is
    freed (seen here on torch 2.13: ~ProcessGroupGloo joins a worker thread that waits for the
    GIL the freeing thread holds)."""
    info = rank_info()
    namespace = {"__name__": "source_example"}
    exec(compile(source_example(fixes), "source_example.py", "exec"), namespace)
    entry = namespace.get("main", namespace["train"])  # the document has no entry point
    losses = entry(info.rank, info.world_size)
    return {"losses": losses, "loss_drop": 1 - losses[-1] / losses[0]}
