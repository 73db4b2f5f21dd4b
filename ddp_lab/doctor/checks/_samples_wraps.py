"""The samples check's wrappers on each rank (samples.py): DataLoader's, the samplers' and
Subset's __init__ (the user's line each was built at; DataLoader's refusal), and
torch.distributed's reducing and gathering functions (counted: the ranks' results combined)."""
from __future__ import annotations

import functools


REDUCING = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
            "gather", "gather_object", "reduce_scatter", "reduce_scatter_tensor")


def count_reductions(rec) -> None:
    """torch.distributed's reducing and gathering functions, as the script calls them, counted:
    an evaluation pass followed by one (before training resumes) feeds a metric of every rank's
    results."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    compiling = torch.compiler.is_compiling

    def counted(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not compiling():
                rec.reductions += 1
            return fn(*args, **kwargs)
        return call

    for op in REDUCING:
        fn = getattr(dist, op, None)
        if fn is None:
            continue
        wrapped = counted(fn)
        for owner in (dist, c10d):
            if getattr(owner, op, None) is fn:
                setattr(owner, op, wrapped)


def wrap_init(cls, ctx, after, refused=None) -> None:
    original = cls.__init__

    @functools.wraps(original)  # inspect.signature(DataLoader) stays PyTorch's (Lightning reads it)
    def __init__(self, *args, **kwargs):
        line = ctx.user_line()
        try:
            original(self, *args, **kwargs)
        except Exception as exc:
            if refused is not None:
                ctx.guard(refused)(line, exc)
            raise
        ctx.guard(after)(self, line)

    cls.__init__ = __init__


def mark_line(obj, line: str) -> None:
    if not getattr(obj, "_ddp_lab_line", ""):  # a subclass's __init__ calls ours: keep the first
        obj._ddp_lab_line = line
