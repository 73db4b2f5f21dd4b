"""Lesson 00: how ranks are launched and read, and the source document's own example, run and fixed.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import difflib
import os

import torch
import torch.distributed as dist

from ..registry import Expect, Lesson, Scenario, Variant
from ..rankinfo import rank_info


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


# The example skeleton that ends the source document, verbatim (its comment says
# "explicitly specify the device").
SOURCE_EXAMPLE = '''\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def setup(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

class CustomModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(10, 10).to(f'cuda:{rank}')  # 显式指定设备

def train(rank, world_size):
    setup(rank, world_size)
    model = CustomModule().cuda(rank)
    ddp_model = DDP(model, device_ids=[rank])
    optimizer = torch.optim.Adam(ddp_model.parameters())
    # 训练循环...
'''

# Each fix, applied on top of the ones before it: (what it fixes, old text, new text).
SOURCE_FIXES = [
    ("import nn", "import torch\n", "import torch\nimport torch.nn as nn\n"),
    ("choose the backend from the hardware: NCCL needs CUDA, gloo runs on CPU",
     'dist.init_process_group("nccl", rank=rank, world_size=world_size)',
     'backend = "nccl" if torch.cuda.is_available() else "gloo"\n'
     '    dist.init_process_group(backend, rank=rank, world_size=world_size)'),
    ("build the module on the CPU; `rank` does not exist inside __init__",
     "nn.Linear(10, 10).to(f'cuda:{rank}')  # 显式指定设备", "nn.Linear(10, 10)"),
    ("move the whole module once, to the rank's device (device_ids only for CUDA), and write "
     "the training loop the document leaves out",
     "    model = CustomModule().cuda(rank)\n    ddp_model = DDP(model, device_ids=[rank])\n"
     "    optimizer = torch.optim.Adam(ddp_model.parameters())\n    # 训练循环...\n",
     "    device = torch.device('cuda', rank) if torch.cuda.is_available() else torch.device('cpu')\n"
     "    model = CustomModule().to(device)\n"
     "    ddp_model = DDP(model, device_ids=[rank] if device.type == 'cuda' else None)\n"
     "    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-2)\n"
     "    torch.manual_seed(rank)\n    losses = []\n    for step in range(20):\n"
     "        x = torch.randn(16, 10, device=device)\n"
     "        loss = (ddp_model(x) - x).pow(2).mean()\n"
     "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
     "        losses.append(loss.item())\n    return losses\n\n\n"
     "def main(rank, world_size):  # the entry point: train, then leave the group\n"
     "    losses = train(rank, world_size)\n    dist.destroy_process_group()\n    return losses\n"),
    ("give the module the forward pass it lacks",
     "        self.layer = nn.Linear(10, 10)\n",
     "        self.layer = nn.Linear(10, 10)\n\n    def forward(self, x):\n        return self.layer(x)\n"),
]


def source_example(fixes: int = 0) -> str:
    """The source document's example with the first `fixes` fixes applied."""
    code = SOURCE_EXAMPLE
    for _, old, new in SOURCE_FIXES[:fixes]:
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


# What each step of the source example does on a CPU machine (gloo; no CUDA in this torch).
SOURCE_STEPS = [
    Expect("error", "NameError", r"name 'nn' is not defined", ranks=(0, 1)),
    Expect("error", "RuntimeError", r"Distributed package doesn't have NCCL built in", ranks=(0, 1)),
    Expect("error", "NameError", r"name 'rank' is not defined", ranks=(0, 1)),
    Expect("error", "RuntimeError", r"Cannot access accelerator device when none is available",
           ranks=(0, 1)),
    Expect("error", "NotImplementedError", r'missing the required "forward" function', ranks=(0, 1)),
    Expect("ok", metric="loss_drop", above=0.2),
]


def _source_variant(fixes: int) -> Variant:
    return Variant(run_source_example, SOURCE_STEPS[fixes], kwargs={"fixes": fixes},
                   init_process_group=False, timeout=30)


def figures(results) -> dict:
    from ..plots import figure, per_rank_lines

    fixed = results["source_example"]["fixed"]
    fig, (ax,) = figure(1, title="The source example, corrected: each rank's loss", width=6.5)
    per_rank_lines(ax, [v["losses"] for v in fixed.values], title="DDP on CPU/gloo, Adam lr=1e-2",
                   xlabel="training step", ylabel="loss (mean squared error)")
    return {"source_example_losses": fig}


LESSON = Lesson(
    id="00",
    error_class="launching ranks",
    title="Launching ranks and reading them",
    notebook="00_launching_ranks",
    figures=figures,
    scenarios=[
        Scenario("one_rank_raises", "One rank raises while the other waits in a collective",
                 broken=Variant(train_on_shards, Expect("error", "RuntimeError",
                                r"mat1 and mat2 shapes cannot be multiplied", ranks=(1,)),
                                kwargs={"features_per_rank": (10, 12)}, grace=2),
                 fixed=Variant(train_on_shards, Expect("ok"), kwargs={"features_per_rank": (10, 10)}),
                 summary="rank 1's shard has 12 columns: its forward fails, rank 0 is left waiting"),
        Scenario("collective_on_one_rank", "A collective only rank 0 calls: a hang, made a timeout",
                 broken=Variant(metric_on_rank0_only, Expect("timeout", match="in all_reduce", ranks=(0,)),
                                timeout=3),
                 fixed=Variant(metric_on_rank0_only, Expect("ok"), kwargs={"everyone": True}),
                 summary="every rank must call every collective; only the printing is rank 0's"),
        Scenario("rank_exits", "A rank exits without a Python exception: a crash",
                 broken=Variant(exit_mid_run, Expect("crashed", match="status 3", ranks=(1,)), grace=2),
                 fixed=Variant(exit_mid_run, Expect("ok"), kwargs={"exit_rank": None}),
                 summary="a rank that leaves with os._exit(3) is reported as crashed, with its status"),
        Scenario("source_example", "The source document's example: as written, then corrected",
                 broken=_source_variant(0), fixed=_source_variant(len(SOURCE_FIXES)),
                 summary="five fixes take it from NameError to a device-agnostic DDP training run"),
    ],
)
