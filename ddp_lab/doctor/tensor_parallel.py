"""The doctor's tensor-parallel check (`strategy="tp"`): the module split with
`parallelize_module` on real ranks, beside the same module whole.

Every rank builds the module from the same seed, keeps a whole copy, splits the module with a
plan and feeds both the SAME batch (tensor parallelism splits weights, not the batch). Then it
compares the outputs and every weight's gradient. The plan is the user's (`tp_plan`), else the
module's own (`tp_plan()` or a `tp_plan` dict, as Hugging Face models carry `_tp_plan`), else a
default found by tracing one forward: ColwiseParallel for each Linear whose output reaches
another Linear, RowwiseParallel for that Linear. It finds: an op DTensor has no sharding rule
for (PyTorch's own message), outputs or gradients that differ from the whole module beyond
TOLERANCE, and a plan that leaves most of the weights whole on every rank.
"""
from __future__ import annotations

import copy

from ..launching.launcher import launch
from ..launching.rankinfo import device, rank_info
from .failures import brief
from .inputs import (DoctorInputError, batch_for, call, default_loss, floating_tensors, move)
from .loader import eval_input
from .report import Finding

TOLERANCE = 1e-4  # relative; split and whole differ by float rounding only (about 1e-7)
WHOLE_SHARE = 0.5  # warn when more than this share of the parameter bytes is not split
NO_RULE = "does not have a sharding strategy registered"
LESSON = "16"


def styles() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def validate_tp_args(strategy: str, tp_plan, amp) -> None:
    if tp_plan is not None and strategy != "tp":
        raise DoctorInputError("tp_plan is used with strategy='tp' only, got "
                               f"strategy={strategy!r}")
    if strategy == "tp" and amp:
        raise DoctorInputError("amp is not checked under strategy='tp': run without it")
    if tp_plan is not None and not (isinstance(tp_plan, dict) or callable(tp_plan)):
        raise DoctorInputError("tp_plan must be a dict {submodule name: ParallelStyle or "
                               f"'colwise'/'rowwise'}}, or a function model -> such a dict; got "
                               f"{type(tp_plan).__name__}")


def eval_plan(expr: str, namespace: dict | None = None):
    """`--tp-plan "{'up': 'colwise', 'down': 'rowwise'}"`, with the parallel styles in scope."""
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
    """(plan, where it came from)."""
    if given is not None:
        return (given(model) if callable(given) else dict(given)), "yours"
    own = getattr(model, "tp_plan", None)
    if own is not None:
        return (own() if callable(own) else dict(own)), "the module's tp_plan"
    return default_plan(copy.deepcopy(model), batch), "the default (traced Linear pairs)"


def as_styles(plan: dict) -> dict:
    known = styles()
    return {n: known[s]() if isinstance(s, str) else s for n, s in plan.items()}


def style_name(style) -> str:
    return style if isinstance(style, str) else type(style).__name__


def relative(a, b, floor: float = 0.0) -> float:
    """|a - b| / |b|; `floor` keeps a value that is zero in exact arithmetic (the gradient of
    a key's bias under softmax) from turning rounding into a large relative error."""
    a = a.full_tensor() if hasattr(a, "full_tensor") else a
    return float((a - b).norm()) / (max(float(b.norm()), floor) or 1.0)


def compare(model, ref, batch) -> dict:
    """Forward and backward of the split `model` and the whole `ref` on the same batch;
    a gradient is measured against 1 % of the largest gradient at least."""
    out, want = call(model, batch), call(ref, batch)
    errors = {"output": max((relative(a, b) for a, b in
                             zip(floating_tensors(out), floating_tensors(want))), default=0.0)}
    default_loss(out).backward()
    default_loss(want).backward()
    pairs = [(n, p.grad, q.grad) for (n, p), (_, q) in
             zip(model.named_parameters(), ref.named_parameters())
             if p.grad is not None and q.grad is not None]
    floor = 0.01 * max((float(g.norm()) for _, _, g in pairs), default=0.0)
    errors.update({f"gradient of {n}": relative(a, b, floor) for n, a, b in pairs})
    return errors


def whole_bytes(model) -> tuple[int, list[str]]:
    """Parameter bytes (and names) that no split touched: plain tensors or Replicate()."""
    from torch.distributed.tensor import DTensor

    whole, names = 0, []
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor) or all(pl.is_replicate() for pl in p.placements):
            whole += p.numel() * p.element_size()
            names.append(name)
    return whole, names


def probe(source, example, given=None) -> dict:
    """One rank: plan, split, compare; PyTorch's message if the split module fails."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    dev, world = device(), rank_info().world_size
    torch.manual_seed(0)  # the same weights on every rank
    model = source.build().to(dev)
    ref = copy.deepcopy(model)
    batch = move(batch_for(example, 0), dev)  # the same batch on every rank
    plan, origin = resolve_plan(model, batch, given)
    out = {"plan": {n: style_name(s) for n, s in plan.items()}, "origin": origin}
    if not plan:
        return out
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    try:
        parallelize_module(model, init_device_mesh(dev.type, (world,)), as_styles(plan))
        whole, names = whole_bytes(model)
        out.update(whole_share=whole / total, whole_names=names, errors=compare(model, ref, batch))
    except Exception as exc:  # PyTorch's own message is the evidence
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def tensor_parallel_findings(source, example, world_size: int, timeout: float, given=None):
    """Launch `probe` on `world_size` ranks; (RunResult, findings of lesson 16)."""
    run = launch(probe, source, example, given=given, world_size=world_size, timeout=timeout,
                 grace=2.0, label="doctor tp")
    values = [r.value for r in run.ranks if r.status == "ok" and r.value]
    if not values:
        first = run.root_cause.error if run.root_cause and run.root_cause.error else None
        why = f"{first.type}: {first.message}" if first else run.describe_failure()
        return run, [Finding("error", "tp-run-failed", LESSON, "the module could not be checked "
                             "under tensor parallelism", [brief(why)])]
    return run, findings(values[0], world_size)


FIX_RULE = ("give DTensor a sharding rule for the op (torch.distributed.tensor.experimental."
            "register_sharding), or hand the op local tensors: ColwiseParallel(use_local_output"
            "=True), the default, or local_map")
FIX_DIFFERS = ("a rank computes with its shard: derive sizes from the local shape (a head count: "
               "view(b, s, -1, head_dim), not view(b, s, heads, -1)); a reduction over a split "
               "dimension (a norm, a softmax, a loss) must see all of it: keep the DTensor "
               "(ColwiseParallel(use_local_output=False)) so DTensor all-reduces it")
FIX_WHOLE = ("name them in the plan (an Embedding: RowwiseParallel(input_layouts=Replicate()); "
             "an output projection: ColwiseParallel(output_layouts=Replicate())), or shard the "
             "rest with FSDP2 over a second mesh dimension")


def findings(v: dict, world_size: int) -> list[Finding]:
    plan_line = "plan (" + v["origin"] + "): " + (", ".join(
        f"{n}: {s}" for n, s in v["plan"].items()) or "nothing to split")
    out = [Finding("info", "tp-plan", LESSON, f"the module split over {world_size} ranks",
                   [plan_line, "the same batch on every rank; forward and backward compared "
                    "with the module whole"])]
    if "error" in v:
        code = "op-without-sharding-strategy" if NO_RULE in v["error"] else "tp-run-failed"
        title = ("an op of the module has no DTensor sharding rule" if NO_RULE in v["error"]
                 else "forward/backward fails with the module split")
        out.append(Finding("error", code, LESSON, title, [f"PyTorch said: {v['error']}", plan_line],
                           fix=FIX_RULE if NO_RULE in v["error"] else ""))
        return out
    if not v["plan"]:
        return out
    errors = dict(v["errors"])
    worst = [("output", errors.pop("output"))] + sorted(errors.items(), key=lambda kv: -kv[1])[:2]
    if max(v["errors"].values()) > TOLERANCE:
        out.append(Finding("error", "tp-output-differs", LESSON,
                           "split, the module computes something else than whole",
                           [f"{what} differs by {err:.1e} (relative; tolerance {TOLERANCE:.0e})"
                            for what, err in worst if err > TOLERANCE] + [plan_line],
                           fix=FIX_DIFFERS))
    if v["whole_share"] > WHOLE_SHARE:
        out.append(Finding("warning", "plan-leaves-weights-whole", LESSON,
                           "most parameter bytes stay whole on every rank",
                           [f"{v['whole_share']:.0%} of the parameter bytes are not split: "
                            + ", ".join(v["whole_names"][:6])
                            + (" ..." if len(v["whole_names"]) > 6 else "")], fix=FIX_WHOLE))
    return out
