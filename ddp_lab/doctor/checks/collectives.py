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

import inspect
import os
import sys
import threading

from ..frames import in_package
from . import _collectives_alias as alias
from ._collectives_copy import Copies, judge_discarded
from ._collectives_judge import KEY, judge as judge_order
from ._collectives_undefined import OUTPUT, Undefined
from ._collectives_uses import Uses
from ._collectives_uses_judge import judge_uses
from .api import KEEP, Check

OPS = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "gather",
       "scatter", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
       "all_to_all_single", "all_gather_object", "broadcast_object_list", "gather_object",
       "scatter_object_list", "monitored_barrier", "_broadcast_coalesced")
USED = frozenset(OUTPUT) | {"broadcast_object_list"}  # the calls whose arguments are followed


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


def _direct(ctx, frame):
    """The user's frame when the script called the collective itself (only ddp_lab's own
    wrappers between), else None (a library's call, DDP's, a check's)."""
    while frame is not None and in_package(frame.f_code.co_filename):
        frame = frame.f_back
    return frame if frame is not None and ctx.is_user_file(frame.f_code.co_filename) else None


def _stack(ctx, frame) -> list:
    """[path, line] of every user frame of the stack, innermost first (the parent reads the
    source there: the broadcast's rule)."""
    out = []
    while frame is not None and len(out) < 12:
        if ctx.is_user_file(frame.f_code.co_filename):
            out.append([frame.f_code.co_filename, frame.f_lineno])
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
    undefined, uses, copies = Undefined(ctx), Uses(ctx), Copies(ctx)
    aliased_lines: set = set()  # the lines whose output lists were judged aliased
    ctx.on_finish(undefined.unpatch)
    names = {}

    def before(op, args, kwargs, own):
        """What the call does to a followed tensor, and what the script's own call (`own`: its
        frame, else None) is given; returns what `after` needs, or None."""
        bound = dict(zip(names[op], args), **kwargs)
        if undefined.ids:
            undefined.before(op, bound, dist.get_rank())
        if own is None:
            return None
        line, grad = ctx.user_line(own), None
        if op in alias.LISTS:
            alias.record(ctx, op, bound, line, own, aliased_lines)
        copies.given(op, bound, line, own)
        if bound.get("group") in (None, getattr(c10d.GroupMember, "WORLD", None)):
            bound["group"] = None  # the default group: ranks are global ranks
            if op in ("broadcast", "broadcast_object_list"):
                uses.broadcast(op, bound, line, _stack(ctx, own))
            grad = uses.grad_before(bound) if op == "all_reduce" else None
        return bound, line, grad

    def after(op, state, out):
        bound, line, grad = state
        if grad is not None:
            uses.grad_after(grad, bound, line)
        if op in OUTPUT and (bound.get("async_op") or op == "reduce"):
            undefined.after(op, bound, out, dist.get_rank(), line, ctx.step)

    before, after = ctx.guard(before), ctx.guard(after)

    def wrap(op, fn):
        used = op in USED

        def collective(*args, **kwargs):
            if ctx.checking or getattr(depth, "n", 0) or torch.compiler.is_compiling():
                return fn(*args, **kwargs)  # a check's own call, or one inside another
            frame = sys._getframe(1)
            if len(kept) < KEEP:
                guarded(op, args, kwargs, frame)
            state = None
            if used and ((own := _direct(ctx, frame)) is not None or undefined.ids):
                state = before(op, args, kwargs, own)  # the script's own call, or one that may
                # read or define a followed tensor; a library's (FSDP2's, DDP's) costs no more
            depth.n = 1
            try:
                out = fn(*args, **kwargs)
            finally:
                depth.n = 0
            if state is not None:
                after(op, state, out)
            return out
        collective.__wrapped__ = fn
        collective.__name__ = getattr(fn, "__name__", op)
        collective.__doc__ = getattr(fn, "__doc__", None)
        return collective

    for op in OPS:
        fn = getattr(dist, op, None) or getattr(c10d, op, None)
        if fn is None:
            continue
        if op in USED:
            names[op] = list(inspect.signature(fn).parameters)
        wrapped = wrap(op, fn)
        for owner in (dist, c10d):
            if getattr(owner, op, None) is fn:
                setattr(owner, op, wrapped)

    def step_line(ctx):
        if "step-line" not in ctx.records and (found := ctx.user_frame()) is not None:
            ctx.emit("step-line", [found[0], found[1]])
    ctx.on_step_end(step_line)


# --- in the parent: _collectives_judge.py (order, hangs), _collectives_uses_judge.py (what a
# result is used for); the loop read from the source: _collectives_loop.py, _collectives_chosen.py

def judge(ev):
    return judge_order(ev) + judge_uses(ev) + alias.judge_aliases(ev) + judge_discarded(ev)


CHECK = Check(
    name="collectives",
    mechanism="the ranks enter the same collectives in the same order (flight recorder, and "
              "torch.distributed's functions wrapped); a hang, with its step and line; a "
              "collective's result read only where and when it is defined (after wait(); a "
              "reduce's on its destination); a broadcast never drops values each rank computed "
              "from its own data; gradients DDP averaged are not all_reduced again; a collective's "
              "output list (all_gather's, all_to_all's, gather's) holds no memory twice; an in-place "
              "collective's result lands in a tensor something keeps",
    lesson="13",
    codes={"collectives-differ-between-ranks": "error", "hang": "error",
           "read-while-undefined": "error", "broadcast-drops-rank-values": "warning",
           "gradients-reduced-again": "error", "collective-outputs-alias": "error",
           "collective-output-discarded": "error"},
    attach=attach, judge=judge, tools=("watch",),
    tests=("tests/doctor/checks/test_collectives.py",
           "tests/doctor/checks/test_collectives_uses.py",
           "tests/doctor/checks/test_collectives_alias.py",
           "tests/doctor/checks/test_collectives_copy.py"),
    notes=("an output list is judged on the script's own all_gather / all_to_all / gather: two "
           "entries of one storage alias when they are one view or both contiguous with "
           "overlapping bytes (interleaved strided views are not judged); named where the list "
           "was made when the source assigns it by name, else at the collective",
           "a Python collective is compared through the first 500 a rank calls; the flight "
           "recorder keeps the newest 2000 of every kind (DDP's included)",
           "the loop's exit is read from the script's source: the `if` around a `break` in the "
           "loop that steps the optimizer, else where its iterable was made",
           "a result is followed from the script's own collective through torch functions (by "
           "the tensor, not its memory: a view made before the collective is not followed; 256 "
           "tensors at once); a read outside torch (a C extension) is not seen",
           "a broadcast is judged when the script calls it itself, on the default group, with at "
           "most 64 numbers, after a forward and before the next backward or step; a value set "
           "under a test of the rank (`if rank == 0:`) is one rank's choice on purpose, not judged",
           "gradients all_reduced as they are (p.grad, p.grad.data) are seen; a flat copy of "
           "them (torch.cat) is not; FSDP2's gradients are not judged"))
