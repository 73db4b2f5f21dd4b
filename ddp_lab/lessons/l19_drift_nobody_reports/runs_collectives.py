"""Lesson 19's collectives, on each rank: an all_gather of tensors whose length differs by rank,
and an async all_reduce read before `wait()`.

Every step records max |what this rank holds - what it should hold|, so a figure can show the
error per step, broken beside fixed."""
from __future__ import annotations

import pickle
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn import functional as F

from ...launching.rankinfo import rank_info


@contextmanager
def gloo_group():
    """A gloo group on the CPU for this rank, on any machine, where the launch made none: what
    these scenarios show is gloo's (on a node with a GPU per rank the course's launcher picks
    NCCL, launching/launcher.py `resolve_backend`, where a size mismatch may hang instead). Their
    variants say init_process_group=False."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


def predictions(rank: int, step: int) -> torch.Tensor:
    """Rank `rank`'s predictions at `step`: 3 + rank + step values. Lengths differ by rank where
    a filter drops samples, or a sampler does not pad; `DistributedSampler(drop_last=False)`
    pads every rank to the same count (torch/utils/data/distributed.py:116-124)."""
    return torch.arange(3 + rank + step, dtype=torch.float32) + 100 * rank + 10 * step


def gather_own_size(pred: torch.Tensor) -> list:
    """The bug: every slot is sized from THIS rank's length."""
    out = [torch.zeros_like(pred) for _ in range(dist.get_world_size())]
    dist.all_gather(out, pred)
    return out


def gather_padded(pred: torch.Tensor) -> list:
    """The fix: gather the lengths, pad to the longest, gather, trim each slot to its length."""
    n = torch.tensor([pred.numel()])
    lengths = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(lengths, n)
    longest = int(max(lengths))
    out = [pred.new_zeros(longest) for _ in lengths]
    dist.all_gather(out, F.pad(pred, (0, longest - pred.numel())))
    return [o[: int(k)] for o, k in zip(out, lengths)]


def gather_right_sizes(pred: torch.Tensor) -> list:
    """Each slot sized to its rank's length (the lengths gathered first): what `all_gather`'s
    docstring calls supported (torch/distributed/distributed_c10d.py:4194-4202). NCCL does it,
    one broadcast per rank (ProcessGroupNCCL.cpp, `allgather`, when the slots' sizes differ);
    gloo refuses it: "ProcessGroupGloo::allgather: invalid tensor size"."""
    n = torch.tensor([pred.numel()])
    lengths = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(lengths, n)
    out = [pred.new_zeros(int(k)) for k in lengths]
    dist.all_gather(out, pred)
    return out


def gather_objects(pred: torch.Tensor) -> list:
    """The other fix: `all_gather_object`, which pickles the tensor, gathers the sizes, pads
    the bytes and gathers them (torch/distributed/distributed_c10d.py:3501-3518)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, pred)
    return out


GATHERS = {"own_size": gather_own_size, "padded": gather_padded, "objects": gather_objects,
           "right_sizes": gather_right_sizes}


def gather_predictions(how: str = "padded", steps: int = 3) -> dict:
    """Gather every rank's predictions at each step with `GATHERS[how]`. Per step, the largest
    error of what this rank assembled against every rank's true predictions (inf when a slot
    has the wrong length), and rank 0's slot as this rank received it."""
    world = dist.get_world_size()
    errors, seen_rank0 = [], []
    for step in range(steps):
        got = GATHERS[how](predictions(rank_info().rank, step))
        truth = [predictions(r, step) for r in range(world)]
        errors.append(max(float((g - t).abs().max()) if g.shape == t.shape else float("inf")
                          for g, t in zip(got, truth)))
        seen_rank0.append(got[0].tolist())
    pred = predictions(rank_info().rank, 0)
    return {"error_per_step": errors, "error": max(errors), "rank0_slot": seen_rank0,
            "raw_bytes": pred.numel() * pred.element_size(),
            "pickled_bytes": len(pickle.dumps(pred))}


def read_async(wait_first: bool = False, steps: int = 5) -> dict:
    """Rank 0 starts an async all_reduce of its values and reads the result; rank 1 enters the
    all_reduce late, only once rank 0 says (through the store) that it got past its read
    (`wait_first=False`, the bug) or past issuing the collective (`wait_first=True`: rank 0
    then calls `work.wait()` before it reads). So the broken read provably precedes the
    collective's completion: no rank 1, no sum. Per step: |read - true sum|.

    `wait()` here is gloo's: it blocks until the sum is there. On NCCL it makes the current CUDA
    stream wait for the collective and returns at once (`Work.wait`'s docstring: "the same as
    calling synchronize(): Letting the current stream block on the completion of the NCCL
    work"); a host read such as `.item()` then synchronises with that stream.
    `_get_default_store` is private (tests/test_private_torch_names.py checks it is there)."""
    rank = rank_info().rank
    store = dist.distributed_c10d._get_default_store()
    errors = []
    for step in range(steps):
        values = torch.full((4,), float(rank + 1 + step))
        truth = sum(float(r + 1 + step) for r in range(dist.get_world_size()))
        if rank == 0:
            work = dist.all_reduce(values, async_op=True)
            if not wait_first:
                read = values.clone()  # read before wait(): the bug
                store.set(f"l19-read-{step}", "1")
                work.wait()
            else:
                store.set(f"l19-read-{step}", "1")
                work.wait()
                read = values.clone()
        else:
            store.wait([f"l19-read-{step}"])
            dist.all_reduce(values)
            read = values.clone()
        errors.append(float((read - truth).abs().max()))
    return {"error_per_step": errors, "error": max(errors)}


def gather_on_gloo(how: str = "padded", steps: int = 3) -> dict:
    """`gather_predictions` on a gloo group of this rank's own (`gloo_group`)."""
    with gloo_group():
        return gather_predictions(how, steps)


def read_async_on_gloo(wait_first: bool = False, steps: int = 5) -> dict:
    """`read_async` on a gloo group of this rank's own (`gloo_group`)."""
    with gloo_group():
        return read_async(wait_first, steps)
