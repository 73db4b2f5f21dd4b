"""The tensor-parallel split's plan (`strategy="tp"`): the user's arguments checked, `--tp-plan`
evaluated with the parallel styles in scope, the module's own `tp_plan`, and `tp_plan="traced"`:
Linear layers paired colwise/rowwise by tracing one forward."""
from __future__ import annotations

import copy

from ..batch import call
from ..errors import DoctorInputError
from ..loader import eval_input


def styles() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def validate_tp_args(strategy: str, tp_plan, amp, parallelize=None) -> None:
    if (tp_plan is not None or parallelize is not None) and strategy != "tp":
        what = "tp_plan" if tp_plan is not None else "parallelize"
        raise DoctorInputError(f"{what} is used with strategy='tp' only, got "
                               f"strategy={strategy!r}")
    if strategy == "tp" and amp:
        raise DoctorInputError("amp is not checked under strategy='tp': run without it")
    if tp_plan is not None and parallelize is not None:
        raise DoctorInputError("give tp_plan or parallelize, not both: parallelize(model, mesh) "
                               "calls parallelize_module with its own plan")
    if parallelize is not None and not callable(parallelize):
        raise DoctorInputError("parallelize must be a function (model, mesh) that splits the "
                               f"model, got {type(parallelize).__name__}")
    if tp_plan is not None and tp_plan != "traced" and not (isinstance(tp_plan, dict)
                                                            or callable(tp_plan)):
        raise DoctorInputError("tp_plan must be a dict {submodule name: ParallelStyle or "
                               f"'colwise'/'rowwise'}}, a function model -> such a dict, or "
                               f"'traced'; got {type(tp_plan).__name__}")


def eval_plan(expr: str, namespace: dict | None = None):
    """`--tp-plan "{'up': 'colwise', 'down': 'rowwise'}"`, with the parallel styles in scope."""
    if expr.strip() == "traced":
        return "traced"
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    scope = dict(namespace or {}, ColwiseParallel=ColwiseParallel, RowwiseParallel=RowwiseParallel,
                 SequenceParallel=SequenceParallel, PrepareModuleInput=PrepareModuleInput,
                 Shard=Shard, Replicate=Replicate)
    return eval_input(expr, scope, "--tp-plan")


def default_plan(model, batch) -> dict:
    """Trace one forward of `model` (a copy: its state may change): which Linear's output
    reaches which Linear. {name: "colwise" | "rowwise"}; pairs whose split output would also
    reach the module's output directly are left out."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    names = {id(m): n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    origin, keep, rowwise, inside = {}, [], {}, []

    def sources(obj) -> frozenset:
        return frozenset().union(*(origin.get(id(t), frozenset()) for t in tree_leaves(obj)
                                   if isinstance(t, torch.Tensor)))

    def mark(obj, src) -> None:
        for t in tree_leaves(obj):
            if isinstance(t, torch.Tensor):
                origin[id(t)] = src
                keep.append(t)  # alive until the trace ends, so no id is reused

    class Flow(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not inside and (src := sources((args, kwargs))):
                mark(out, src)
            return out

    def enter(module, args):
        if src := sources(args):
            rowwise[names[id(module)]] = src
        inside.append(module)

    def leave(module, args, out):
        inside.pop()
        name = names[id(module)]
        mark(out, frozenset() if name in rowwise else frozenset([name]))

    hooks = [h for m in model.modules() if id(m) in names
             for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        with torch.no_grad(), Flow():
            escaped = sources(call(model, batch))
    finally:
        for h in hooks:
            h.remove()
    plan = {}
    for row, cols in rowwise.items():
        if not cols & escaped:
            plan.update({c: "colwise" for c in cols}, **{row: "rowwise"})
    return dict(sorted(plan.items()))


def resolve_plan(model, batch, given) -> tuple[dict, str]:
    """(plan, where it came from). Without a plan of the user's or the module's, none: a traced
    colwise/rowwise pairing cannot know a layout (a fused QKV split contiguously mixes q, k
    and v), so only `tp_plan="traced"` asks for `default_plan`."""
    if isinstance(given, str) and given == "traced":
        return default_plan(copy.deepcopy(model), batch), "traced Linear pairs (tp_plan='traced')"
    if given is not None:
        return (given(model) if callable(given) else dict(given)), "yours"
    own = getattr(model, "tp_plan", None)
    if own is not None:
        return (own() if callable(own) else dict(own)), "the module's tp_plan"
    return {}, "none"


def as_styles(plan: dict) -> dict:
    known = styles()
    return {n: known[s]() if isinstance(s, str) else s for n, s in plan.items()}


def style_name(style) -> str:
    return style if isinstance(style, str) else type(style).__name__
