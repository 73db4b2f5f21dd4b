"""Values the script logs (loss, gradient norm, accuracy) against their true global value.

On each rank, from outside: the loss functions' outputs with their count of terms (for
cross_entropy the targets not equal to ignore_index), every backward's value, the gradient norm
`clip_grad_norm_` returns and, under FSDP2, the norm of this rank's shard of the gradients (at
`clip_grad_norm_` and at each optimizer step's end), the script's own `dist.all_reduce`
(its value before and after; never a collective of ours) and the numbers the script turns into
Python numbers (`item`, `float`, `tolist`, a tensor in an f-string) on a line that logs them
(print, logger.info, wandb.log, ...). In the parent: the true value of a step's loss is
sum(loss x count) / sum(count) over ranks and micro-batches; a logged value equal to a known
wrong formula while the true value differs is a warning; a rank's own loss is a note, and so is
its own last micro-batch's unless the script reduces that step's loss across ranks itself (then
it claims a global number and shows another). A value that matches no formula, or a step we
cannot read (two losses per backward, a sum reduction), is left alone: a false alarm is worse
than a miss. Two parts judge what is not a logged number: _logged_scale.py (the loss backward()
runs on, divided by the world size under a wrapper that averages) and _logged_padding.py
(reductions over all_gather'ed rows that count the padding).
"""
from __future__ import annotations

import inspect
import math
import sys

from ._logged_judge import judge
from ._logged_lines import logged_how
from ._logged_padding import Padding, padding_functions, wrap_gathers
from ._logged_scale import Scaling, averaging, scale_functions
from .api import Check
CLASS_LOSSES = ("cross_entropy", "nll_loss")
ELEMENT_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                  "binary_cross_entropy_with_logits")


# --- rank side ------------------------------------------------------------------------------
def attach(ctx):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    state = {"rows": 0, "reduces": 0}
    scaling = Scaling(ctx, scale_functions())
    losses = [getattr(F, n) for n in CLASS_LOSSES + ELEMENT_LOSSES]
    ctx.on_torch_function(losses, lambda f, a, k, out: _on_loss(ctx, f, a, k, out, scaling))
    ctx.on_torch_function([torch.Tensor.backward, torch.autograd.backward],
                          lambda f, a, k, out: _on_backward(ctx, a, scaling))
    ctx.on_torch_function([torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__format__,
                           torch.Tensor.tolist], lambda f, a, k, out: _on_number(ctx, f, a, out))
    clip, reduce_ = torch.nn.utils.clip_grad_norm_, dist.all_reduce

    def clip_grad_norm_(parameters, *args, **kwargs):
        if not isinstance(parameters, torch.Tensor):
            parameters = list(parameters)  # a generator: read it once, for both of us
        shard = ctx.guard(_shard_norm)(parameters)
        out = clip(parameters, *args, **kwargs)
        ctx.guard(_on_norm)(ctx, out, shard, args, kwargs)
        return out

    def all_reduce(tensor, *args, **kwargs):
        before = ctx.guard(_small)(tensor)
        out = reduce_(tensor, *args, **kwargs)
        ctx.guard(_on_reduce)(ctx, state, tensor, before, args, kwargs)
        return out

    torch.nn.utils.clip_grad_norm_, dist.all_reduce = clip_grad_norm_, all_reduce
    padding = Padding(ctx, padding_functions())
    wrapped = wrap_gathers(ctx, dist, padding)
    ctx.on_step_end(padding.stop)
    ctx.on_model(lambda c, w: _count_rows(c, w, state))
    ctx.on_step_end(lambda c: state.update(rows=0))
    ctx.on_step_end(_norm_at_step_end)
    ctx.on_step_end(scaling.stop)
    ctx.on_step_end(lambda c: c.step == 0 and c.emit("logged.wrappers", averaging(c)))

    def undo(c):  # only what is still ours: a check that wrapped after us keeps its own
        if torch.nn.utils.clip_grad_norm_ is clip_grad_norm_:
            torch.nn.utils.clip_grad_norm_ = clip
        if dist.all_reduce is all_reduce:
            dist.all_reduce = reduce_
        for name, (mine, theirs) in wrapped.items():
            if getattr(dist, name) is mine:
                setattr(dist, name, theirs)
    ctx.on_finish(undo)



def _small(tensor, most=8):
    """A few floats of a small tensor (a DTensor's local part), else None."""
    t = getattr(tensor, "_local_tensor", tensor)
    if not hasattr(t, "numel") or t.numel() > most or t.is_complex():
        return None
    return [float(x) for x in t.detach().reshape(-1).tolist()]


_SIGNATURES: dict = {}


def _on_loss(ctx, func, args, kwargs, out, scaling):
    if type(out).__name__ != "Tensor" or out.numel() != 1:
        return
    b = _bound(func, args, kwargs)
    rec = {"s": ctx.step, "fn": func.__name__, "v": float(out.detach()),
           "grad": bool(out.requires_grad), "red": b.get("reduction", "mean")}
    if b.get("size_average") is not None or b.get("reduce") is not None or rec["red"] not in (
            "mean", "sum"):
        rec["red"] = "other"
    else:
        rec["n"] = _count(func.__name__, b)
    ctx.add("logged.train", rec, later=True)  # one write per step (_context_records.py)
    if rec["grad"]:
        scaling.start(out)


def _bound(func, args, kwargs) -> dict:
    """{parameter: value} as `inspect.signature(func).bind(*args, **kwargs).arguments` gives it
    (the arguments given, no defaults), from the names of the positional parameters found once
    per function: a Signature.bind per loss call cost more than the rest of the handler."""
    names = _SIGNATURES.get(func)
    if names is None:
        params = inspect.signature(func).parameters.values()
        names = _SIGNATURES[func] = () if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                              for p in params) else tuple(
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    if not names or len(args) > len(names):
        return inspect.signature(func).bind(*args, **kwargs).arguments
    b = dict(zip(names, args))
    b.update(kwargs)
    return b


def _count(name, b) -> float:
    """The number of terms a "mean" reduction divides by: for cross_entropy and nll_loss with
    class indices, the sum of w[y_n] over the targets not equal to ignore_index (1 each without
    a weight; torch 2.13 nn/modules/loss.py:1233-1239 and :170-176), else every element."""
    import torch

    x, y = b["input"], b["target"]
    if name not in CLASS_LOSSES:  # the shapes equal: no broadcast_shapes (Python, per call)
        return float(x.numel() if x.shape == y.shape else torch.broadcast_shapes(x.shape, y.shape).numel())
    if y.is_floating_point():  # class probabilities: every sample counts
        return float(x.numel() // x.shape[1] if x.dim() > 1 else 1)
    valid = y != b.get("ignore_index", -100)
    w = b.get("weight")
    return float(w[y[valid]].sum()) if w is not None else float(valid.sum())


def _on_backward(ctx, args, scaling):
    t = args[0] if args else None
    if isinstance(t, (list, tuple)):
        t = t[0] if len(t) == 1 else None
    if t is not None and hasattr(t, "numel") and t.numel() == 1:
        ctx.add("logged.train", {"s": ctx.step, "fn": "backward", "v": float(t.detach()),
                                 **scaling.finish(t)}, later=True)
    else:
        scaling.stop()


def _shard_norm(parameters):
    """The 2-norm of this rank's local shards of the gradients, when they are DTensors (FSDP2);
    computed from the local parts only: no collective."""
    import torch

    grads = [p.grad for p in ([parameters] if isinstance(parameters, torch.Tensor) else parameters)
             if getattr(p, "grad", None) is not None]
    if not grads or not all(type(g).__name__ == "DTensor" for g in grads):
        return None
    # one _foreach_norm of the local parts (torch's get_total_norm's), every step's end under FSDP2
    local = [getattr(g, "_local_tensor", None) for g in grads]
    if any(t is None for t in local):
        local = [g.to_local() for g in grads]
    with torch.no_grad():
        norms = torch._foreach_norm([t if t.dtype == torch.float32 else t.float() for t in local], 2.0)
        return math.sqrt(float(torch.stack(norms).double().pow(2).sum()))


def _on_norm(ctx, out, shard, args, kwargs):
    """clip_grad_norm_'s result: on torch 2.13 a Replicate DTensor under FSDP2, so its local value
    is the model's norm: the per-gradient norms are _NormPartial DTensors (distributed/tensor/
    _ops/_math_ops.py:67) and the final vector_norm of nn/utils/clip_grad.py:105 reduces them."""
    p = float(kwargs.get("norm_type", args[1] if len(args) > 1 else 2.0))
    full = _small(out, 1)
    if full and p == 2.0:
        ctx.add("logged.norm", {"s": ctx.step, "v": full[0], "shard": shard,
                                "replicated": all(type(x).__name__ == "Replicate" for x in
                                                  getattr(out, "placements", ()))})


def _norm_at_step_end(ctx):
    """Under FSDP2, the norm of this rank's gradient shards at the step's end (when the script
    did not clip in this step): the parent adds the ranks' squares into the model's norm."""
    if any(e["s"] == ctx.step for e in ctx.records.get("logged.norm", [])[-3:]):
        return
    for w in ctx.models:
        if w.kind == "fsdp2":
            shard = _shard_norm(list(w.module.parameters()))
            if shard is not None:
                ctx.add("logged.norm", {"s": ctx.step, "v": None, "shard": shard})


def _on_reduce(ctx, state, tensor, before, args, kwargs):
    state["reduces"] += 1
    op = kwargs.get("op", args[0] if args else None)
    after = None if kwargs.get("async_op") else _small(tensor)
    if before is not None:
        ctx.add("logged.reduce", {"s": ctx.step, "i": state["reduces"], "op": str(op or "SUM"),
                                  "before": before, "after": after, "rows": state["rows"],
                                  "line": ctx.user_line()})


def _count_rows(ctx, watched, state):
    """Rows the model evaluates without gradient (the samples behind a metric), counted by a
    forward pre-hook on the plain module. Never on a compiled model: a hook changes what dynamo
    traces (measured: torch.compile(DDP(m)) made 2 graphs with the hooks, none without), so a
    model compiled after it was hooked loses the hooks before its first forward."""
    import torch

    hooks = state.setdefault("hooks", [])
    if watched.kind == "compiled":
        inside = {id(m) for m in watched.module.modules()}
        for module, handles in list(hooks):
            if id(module) in inside:
                for h in handles:
                    h.remove()
                hooks.remove((module, handles))
        return
    if type(watched.module).__name__ == "OptimizedModule" or any(
            w.kind == "compiled" and any(m is w.module for m in watched.module.modules())
            for w in ctx.models):
        return

    def rows(module, args, kwargs):
        state["depth"] = state.get("depth", 0) + 1
        if torch.is_grad_enabled() or state["depth"] > 1:
            return  # training, or a wrapped module inside one already counted (FSDP2's units)
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor) and a.dim() > 0:
                state["rows"] += int(a.shape[0])
                return

    def done(module, args, output):
        state["depth"] = max(0, state.get("depth", 0) - 1)
    hooks.append((watched.module, [
        watched.module.register_forward_pre_hook(ctx.user_hook(rows), with_kwargs=True),
        watched.module.register_forward_hook(ctx.user_hook(done))]))


def _on_number(ctx, func, args, out):
    frame = sys._getframe(1)
    while frame is not None and not ctx.is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    t = args[0] if args else None
    if frame is None or t is None or t.numel() > 8:
        return
    how = logged_how(frame, func.__name__)
    if how is None:
        return
    kind, scale = how
    if func.__name__ in ("item", "__float__") and kind != "format":
        values = [float(out) * scale]
    elif func.__name__ == "tolist" and kind != "format":
        values = [float(v) * scale for v in _small(t) or []]
    elif func.__name__ == "__format__" and t.numel() == 1:
        # f"{loss:.4f}": Tensor.__format__ calls item() itself (torch/_tensor.py:1142), inside
        # the mode's handler where the mode is off: the formatted tensor is the value shown
        values = [float(t.detach())]
    else:
        return
    ctx.add("logged.value", {"s": ctx.step, "v": values, "line": ctx.user_line(frame)})


# --- parent side: _logged_judge.py (judge) ----------------------------------------------------
CHECK = Check(
    name="logged",
    mechanism="values the script logs (loss, gradient norm, accuracy) against their global "
              "value, weighted by each rank's count and accumulation-aware; the loss backward() "
              "runs on against the criterion's (the update's size against one process's); "
              "reductions over all_gather'ed rows against the rows the ranks hold (no padding)",
    lesson="14",
    codes={"logged-value-not-global": "warning", "logged-value-one-rank": "info",
           "loss-divided-by-world-size": "warning", "gathered-padding-counted": "warning"},
    attach=attach, judge=judge, tools=("watch",),
    tests=("tests/doctor/checks/test_logged.py", "tests/doctor/checks/test_logged_scale.py",
           "tests/doctor/checks/test_logged_padding.py"),
    notes=("a number logged after Python arithmetic on another line (x = loss.item(); "
           "print(x / n)) is not seen: only conversions on the logging line are compared",
           "a training step with two losses for one backward, or a sum reduction, is not "
           "judged (an evaluation's sum is read as a mean over its count)",
           "a value aggregated over several steps is compared with the steps since its line "
           "last logged (an epoch's mean); a running mean over a sliding window is not",
           "a rank's own loss (its last micro-batch's) is a note unless the script reduces that "
           "step's loss across ranks itself",
           "a loss divided by the world size is read from the line that divides it (a name or "
           "get_world_size(), never a literal) or from a division by every rank's count of "
           "terms; a loss made in a function the user's line calls, or scaled by a tensor that "
           "needs grad, is not judged; gradients also all_reduced by hand are not accounted",
           "padding is known from the sizes the script gathers before the parts (all_gather "
           "or all_gather_object); a DistributedSampler's repeated samples are not padding "
           "here (the samples check's); rows are followed through the common row-keeping ops "
           "until the step ends, and only sum, mean, nansum, nanmean and count_nonzero over "
           "them are compared; a metric computed after tolist() or numpy() is not seen"))
