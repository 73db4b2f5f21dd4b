"""The reference check's hooks on each rank of both runs (reference.py attaches them): where the
optimizers and schedulers are made (the line, and the line that made the learning rate they were
given), the script's own all_reduce of a parameter's `.grad` (on top of DDP's average), the
precision autocast computes in, and dropout, switched off in both runs for the compared steps
(two runs' random masks never agree; what it costs: those steps train without dropout, said in
the report). Dropout inside a compiled region is left on (a switch dynamo would guard on
recompiles every step): its model's parting is explained, not judged."""
from __future__ import annotations

from ..userline import describe
from ._reference_data import user_frame
from ._reference_lines import source_line

OPTIMIZERS = "reference.optimizers"
REDUCED = "reference.grad-reduce"
DROPPED = "reference.dropout"
PRECISION = "reference.precision"
DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


RANDOM = "reference.random"
DRAWS = ("randn", "randn_like", "rand", "rand_like", "randint", "randint_like", "randperm",
         "normal", "bernoulli", "multinomial", "poisson")
DRAWS_IN_PLACE = ("normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_",
                  "cauchy_", "log_normal_")


def attach(ctx, steps: int, models, shared: dict) -> None:
    """`models()`: the parameters of the compared model (for the .grad all_reduce); `shared`:
    the data part's ("drawing": inside a DataLoader's __next__)."""
    _made_where(ctx)
    _grad_reduces(ctx, steps, models)
    _dropout_off(ctx, steps)
    _autocast(ctx, steps)
    _random_draws(ctx, steps, shared)


def _random_draws(ctx, steps: int, shared: dict) -> None:
    """Random numbers the step draws after its batch (noise added to the inputs, a random mask,
    diffusion's noise and timesteps): each rank draws its own, one process others, so the two
    runs legitimately part there (the judge explains a parting, never flags it). Draws inside a
    DataLoader change the batch's rows, which the data part compares already; draws before the
    step's first batch (making the data set or the model) are the same in both runs."""
    import torch

    funcs = [getattr(torch, n) for n in DRAWS if hasattr(torch, n)]
    funcs += [getattr(torch.Tensor, n) for n in DRAWS_IN_PLACE if hasattr(torch.Tensor, n)]
    seen: set = set()

    def drawn(func, args, kwargs, result) -> None:
        if ctx.step >= steps or shared.get("drawing") or shared.get("drawn") != ctx.step:
            return  # before the step's first batch (making the data set, the model) or inside one
        line = ctx.user_line()
        if not line or (ctx.step, line) in seen:
            return
        seen.add((ctx.step, line))
        ctx.add(RANDOM, {"s": ctx.step, "fn": getattr(func, "__name__", str(func)), "line": line})

    ctx.on_torch_function(funcs, drawn)


def _swap(ctx, owner, name: str, new) -> None:
    old = getattr(owner, name)
    setattr(owner, name, new)
    ctx.on_finish(lambda c: getattr(owner, name) is new and setattr(owner, name, old))


def _made_where(ctx) -> None:
    import torch
    from torch.optim import lr_scheduler

    for owner, key in ((torch.optim.Optimizer, "optimizer"), (lr_scheduler.LRScheduler, "scheduler")):
        def wrapped(obj, *args, _init=owner.__init__, _key=key, **kwargs):
            _init(obj, *args, **kwargs)
            if not getattr(obj, "_ddp_lab_reference_seen", False):
                obj._ddp_lab_reference_seen = True  # a subclass's __init__ calls ours: once
                ctx.guard(_made)(ctx, obj, _key)

        _swap(ctx, owner, "__init__", wrapped)


def _made(ctx, obj, key: str) -> None:
    frame = user_frame(ctx)
    if frame is None:
        return
    rec = {"kind": key, "type": type(obj).__name__, "line": ctx.user_line(frame), "s": ctx.step}
    if key == "optimizer":
        rec["lrs"] = [float(g["lr"]) for g in obj.param_groups]
        made = source_line(frame, (), "lr", 1)
        rec["lr_line"] = describe(frame.f_code.co_filename, made)
    ctx.add(OPTIMIZERS, rec)


def _grad_reduces(ctx, steps: int, models) -> None:
    import torch.distributed as dist

    reduce_ = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        if ctx.step < steps:
            ctx.guard(_reduced)(ctx, tensor, args, kwargs, models)
        return reduce_(tensor, *args, **kwargs)

    _swap(ctx, dist, "all_reduce", all_reduce)


def _reduced(ctx, tensor, args, kwargs, models) -> None:
    name = next((n for n, p in models() if p.grad is not None and p.grad is tensor), None)
    if name is None:
        return
    op = kwargs.get("op", args[0] if args else "SUM")
    ctx.add(REDUCED, {"s": ctx.step, "param": name, "op": str(op).rsplit(".", 1)[-1],
                      "line": ctx.user_line()})


def _dropout_off(ctx, steps: int) -> None:
    import torch
    import torch.nn.functional as F

    compiling = torch.compiler.is_compiling
    count = {"n": 0, "s": 0}

    def switched(fn):
        def dropout(input, p=0.5, training=True, inplace=False):
            # is_compiling() first: dynamo reads it as True and never guards on the step
            if not compiling() and training and p > 0 and ctx.step < steps:
                count["n"] += 1
                training = False
            return fn(input, p, training, inplace)
        dropout.__wrapped__ = fn
        return dropout

    for name in DROPOUTS:
        if hasattr(F, name):
            _swap(ctx, F, name, switched(getattr(F, name)))
    sdpa = F.scaled_dot_product_attention

    def attention(*args, **kwargs):
        if not compiling() and ctx.step < steps:
            if len(args) > 4 and args[4]:
                args, count["n"] = (*args[:4], 0.0, *args[5:]), count["n"] + 1
            elif kwargs.get("dropout_p"):
                kwargs, count["n"] = dict(kwargs, dropout_p=0.0), count["n"] + 1
        return sdpa(*args, **kwargs)

    _swap(ctx, F, "scaled_dot_product_attention", attention)

    def at_step_end(c):
        if count["n"]:
            c.add(DROPPED, {"s": c.step, "n": count["n"]})
        count["n"] = 0

    ctx.on_step_end(at_step_end)


def _autocast(ctx, steps: int) -> None:
    import torch
    from torch.amp import autocast_mode

    compiling = torch.compiler.is_compiling
    enter = autocast_mode.autocast.__enter__
    seen = set()

    def __enter__(self):
        if not compiling() and ctx.step < steps and getattr(self, "_enabled", False):
            dtype = str(getattr(self, "fast_dtype", "")).replace("torch.", "")
            if dtype not in seen:
                seen.add(dtype)
                ctx.add(PRECISION, {"s": ctx.step, "dtype": dtype})
        return enter(self)

    _swap(ctx, autocast_mode.autocast, "__enter__", __enter__)
