"""What each rank runs in lesson 13: four training loops that hang (or go silently wrong) the
way real jobs do, each beside its fix. Every loop returns what it did, so the notebook and the
figure read it from the run."""
from __future__ import annotations

import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ...launching.flight import parse
from ...launching.rankinfo import scratch_dir
from .modules import Classifier


def _batch(step: int, rank: int, n: int = 8):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long()


def _train_step(model, opt, step: int) -> float:
    x, y = _batch(step, dist.get_rank())
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def evaluate(model) -> float:
    """Accuracy on a held-out batch: what rank 0 logs after each epoch."""
    x, y = _batch(10_000, 0, n=32)
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def _stats_broadcasts(size: int) -> int:
    """How many broadcasts of `size` float32 values (the BatchNorm's running statistics, which
    DDP's buffer sync sends as one flat tensor) this rank's flight record holds so far."""
    record = parse(torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False))
    return sum(c.op == "broadcast" and c.sizes == ((size,),) and c.dtypes == ("float32",)
               for c in record)


def buffer_broadcasts_per_forward(plan=("train", "train", "eval", "eval", "train", "train")):
    """Every rank runs the same forwards through the DDP wrapper: "train" a step with gradients,
    "eval" a forward under no_grad in eval(). For each forward, whether DDP broadcast the
    BatchNorm's running statistics from rank 0, counted from this rank's own flight record."""
    torch.manual_seed(0)
    ddp = DDP(Classifier())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    stats = sum(b.numel() for b in ddp.module.buffers() if b.is_floating_point())
    counts = []
    for step, kind in enumerate(plan):
        before = _stats_broadcasts(stats)
        if kind == "train":
            _train_step(ddp, opt, step)
        else:
            evaluate(ddp)
        counts.append(_stats_broadcasts(stats) - before)
    return {"plan": list(plan), "broadcasts": counts, "stats": stats}


def train_and_evaluate_on_rank0(through_wrapper: bool = True, steps: int = 2,
                                detail_after_init: bool = False):
    """Hang 1: `if rank == 0: evaluate(ddp_model)`. The first forward after a training step
    broadcasts the BatchNorm buffers from rank 0 (DDP syncs buffers in a forward that follows a
    grad-enabled one, even under no_grad), a collective rank 1 never joins: it waits at the
    end-of-epoch barrier.
    `detail_after_init`: DETAIL set once the group exists (set at its creation, it wraps the
    group, and DDP segfaults on this build -- lesson 06)."""
    if detail_after_init:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    torch.manual_seed(0)
    ddp = DDP(Classifier())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        _train_step(ddp, opt, step)
    accuracy = None
    if dist.get_rank() == 0:
        accuracy = evaluate(ddp if through_wrapper else ddp.module)
    dist.barrier()  # every rank meets before the next epoch
    return {"accuracy": accuracy}


def save_checkpoint_slowly(model, path: str, seconds: float) -> None:
    """torch.save, then a sleep standing in for a slow or busy file system."""
    torch.save(model.state_dict(), path)
    time.sleep(seconds)


def train_with_rank0_save(wait_in_barrier: bool = False, pg_timeout: float = 1.0,
                          save_seconds: float = 2.0):
    """Hang 2: rank 0 saves a checkpoint for longer than the process group's timeout while
    rank 1 already waits in the next step's all_reduce."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout))
    # every rank makes the group, before training: one whose timeout covers a save
    patient = dist.new_group(backend="gloo", timeout=timedelta(seconds=save_seconds + 30))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    grads_synced = 0
    with tempfile.TemporaryDirectory(dir=scratch_dir()) as tmp:
        for step in range(3):
            if step == 1 and dist.get_rank() == 0:
                save_checkpoint_slowly(model, os.path.join(tmp, "ckpt.pt"), save_seconds)
            if step == 1 and wait_in_barrier:
                dist.barrier(group=patient)  # waits for the save on a group that can wait
            for p in model.parameters():
                p.grad = torch.ones_like(p)
                dist.all_reduce(p.grad)
            grads_synced += 1
    dist.destroy_process_group()
    return {"steps": grads_synced}


def local_loss(step: int, rank: int) -> float:
    """The validation loss each rank measures on its own shard: rank 0's falls faster."""
    return 1.0 / (1 + step * (2 if rank == 0 else 1))


def train_with_early_stopping(agree: bool = False, threshold: float = 0.3, max_steps: int = 10):
    """Hang 3: each rank decides on its own to stop early. With `agree`, the ranks all_reduce
    the decision (MAX: stop when any rank wants to) so they run the same number of steps."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    steps = 0
    for step in range(max_steps):
        for p in model.parameters():  # gradient averaging, as DDP does it
            p.grad = torch.ones_like(p)
            dist.all_reduce(p.grad)
        steps += 1
        stop = torch.tensor(float(local_loss(step, dist.get_rank()) < threshold))
        if agree:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
    dist.barrier()  # every rank meets before the final checkpoint
    return {"steps": steps}


def broadcast_vocabulary(send_length_first: bool = False):
    """Hang 4: rank 0 broadcasts its vocabulary (token ids) to the other ranks; each rank sizes
    the receiving tensor from what it read locally. With `send_length_first`, rank 0 first
    broadcasts the length and every rank makes a tensor of that size."""
    vocab = torch.arange(4, dtype=torch.float32) if dist.get_rank() == 0 else torch.full((8,), -1.0)
    if send_length_first:
        n = torch.tensor([len(vocab)])
        dist.broadcast(n, src=0)
        vocab = vocab if dist.get_rank() == 0 else torch.empty(int(n.item()))
    dist.broadcast(vocab, src=0)
    truth = torch.arange(4, dtype=torch.float32)
    same = vocab.shape == truth.shape and torch.equal(vocab, truth)
    return {"length": len(vocab), "wrong": 0 if same else 1, "vocab": vocab.tolist()}


def torch_analyser(folder: str, *flags: str, fill_group_table: bool = False) -> None:
    """PyTorch's own flight-recorder analyser, as `python -m
    torch.distributed.flight_recorder.fr_trace FOLDER FLAGS` runs it, on the dump files in
    `folder` (one per rank, PREFIX + rank); launch it on one rank without a process group and
    read its output from the rank's stderr, its failure from the rank's error.

    `fill_group_table`: gloo's record on torch 2.13 lists no process group (its `pg_config` is
    one entry named '' with ranks '[]'), which the analyser cannot match its entries to. This
    writes a copy of each file whose table names every group the entries use, with every rank
    that left a file (right for a run whose groups span all ranks), and analyses the copies."""
    import pickle
    import re

    from torch.distributed.flight_recorder.fr_trace import main

    if not fill_group_table:
        return main([folder, *flags])
    files = {int(re.search(r"(\d+)$", f).group(1)): f for f in sorted(os.listdir(folder))}
    with tempfile.TemporaryDirectory(prefix="filled-") as filled:
        for name in files.values():
            with open(os.path.join(folder, name), "rb") as f:
                record = pickle.load(f)
            groups = {e["process_group"] for e in record["entries"]}
            record["pg_config"] = {uid: {"name": uid, "desc": desc, "ranks": str(sorted(files))}
                                   for uid, desc in groups}
            with open(os.path.join(filled, name), "wb") as f:
                pickle.dump(record, f)
        main([filled, *flags])
