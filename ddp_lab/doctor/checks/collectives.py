"""The ranks enter the same collectives in the same order; where they do not, or where they hang,
the step it happened in and the user's line.

Two records, compared across ranks:
- PyTorch's flight recorder (every launch arms it: ddp_lab.launching.flight): every collective a
  rank entered, DDP's own included (its gradient all_reduce is issued by the C++ reducer, which
  no Python hook sees). `divergence.find` names the first one the ranks entered differently.
- This check's hook, wrapped around torch.distributed's collective functions at their module
  attributes (DDP looks `dist._broadcast_coalesced` up there at each forward:
  torch/nn/parallel/distributed.py:2363): per call, the op, the step, the tensor's shape and
  the user's frames. It names the line. Under torchrun (no flight recorder) it is the record.

The line at fault: a line only some ranks called a collective from (a barrier under
`if rank == 0:`, a validation forward through the DDP wrapper on rank 0 only); the line where
the ranks passed different tensors; and, when a rank left the training loop while another was
still inside it (an early stop decided per rank, a rank that ran out of batches), the loop's
exit: the `if` around its `break`, else where the loop's iterable was made.
"""
from __future__ import annotations

import os
import sys
import threading

from ._collectives_judge import KEY, judge
from .api import KEEP, Check

OPS = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "gather",
       "scatter", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
       "all_to_all_single", "all_gather_object", "broadcast_object_list", "gather_object",
       "scatter_object_list", "monitored_barrier", "_broadcast_coalesced")


# --- on each rank ------------------------------------------------------------------------------

def _shape(args):
    """The first tensor argument's shape (for a list: its length, its first's shape); None: no
    tensor."""
    import torch

    for a in args:
        if isinstance(a, torch.Tensor):
            return list(a.shape)
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return f"{len(a)} tensors, the first {list(a[0].shape)}"
    return None


def _frames(ctx, frame) -> list:
    """"file:line" of every user frame of the stack, innermost first."""
    out = []
    while frame is not None and len(out) < 12:
        if ctx.is_user_file(frame.f_code.co_filename):
            out.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}")
        frame = frame.f_back
    return out


def attach(ctx):
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    depth = threading.local()

    def record(op, args, kwargs, frame):
        group = kwargs.get("group")
        if group is not None and group is not getattr(c10d.GroupMember, "WORLD", None):
            return  # a subgroup's collectives are compared only by the flight recorder
        ctx.add(KEY, {"op": op.lstrip("_"), "step": ctx.step, "line": ctx.user_line(frame),
                      "shape": _shape(args), "stack": _frames(ctx, frame)})

    guarded = ctx.guard(record)
    kept = ctx.records.setdefault(KEY, [])

    def wrap(op, fn):
        def collective(*args, **kwargs):
            if (len(kept) >= KEEP or ctx.checking or getattr(depth, "n", 0)
                    or torch.compiler.is_compiling()):
                return fn(*args, **kwargs)  # kept full, a check's own call, or one inside another
            guarded(op, args, kwargs, sys._getframe(1))
            depth.n = 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth.n = 0
        collective.__wrapped__ = fn
        collective.__name__ = getattr(fn, "__name__", op)
        collective.__doc__ = getattr(fn, "__doc__", None)
        return collective

    for op in OPS:
        fn = getattr(dist, op, None) or getattr(c10d, op, None)
        if fn is None:
            continue
        wrapped = wrap(op, fn)
        for owner in (dist, c10d):
            if getattr(owner, op, None) is fn:
                setattr(owner, op, wrapped)

    def step_line(ctx):
        if "step-line" not in ctx.records and (found := ctx.user_frame()) is not None:
            ctx.emit("step-line", [found[0], found[1]])
    ctx.on_step_end(step_line)


# --- in the parent: _collectives_judge.py; the loop read from the source: _collectives_loop.py --

CHECK = Check(
    name="collectives",
    mechanism="the ranks enter the same collectives in the same order (flight recorder, and "
              "torch.distributed's functions wrapped); a hang, with its step and line",
    lesson="13",
    codes={"collectives-differ-between-ranks": "error", "hang": "error"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_collectives.py",
    notes=("a Python collective is compared through the first 500 a rank calls; the flight "
           "recorder keeps the newest 2000 of every kind (DDP's included)",
           "the loop's exit is read from the script's source: the `if` around a `break` in the "
           "loop that steps the optimizer, else where its iterable was made"))
