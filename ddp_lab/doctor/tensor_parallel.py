"""The doctor's tensor-parallel check (`strategy="tp"`): the module split on real ranks as the
user splits it, beside the same module whole; then the split module's checkpoint round trip.

Every rank builds the module from the same seed, keeps a whole copy, splits the module and
feeds both the SAME batch (tensor parallelism splits weights, not the batch) for STEPS SGD
steps, recording each step's output and the first step's gradients paired by name. The split
is the user's own `parallelize(model, mesh)` (parallelize_module and whatever they do after
it: re-tying weights, a bias sharded by hand), else a plan: `tp_plan`, else the module's own
(`tp_plan()` or a `tp_plan` dict, as Hugging Face models carry `_tp_plan`); with none, nothing
is split (checks/tp_parallelize.py says the check needs a plan; `tp_plan="traced"` asks for
`default_plan`). Findings are built by checks/tp_parallelize.py and checks/roundtrip.py.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager

from ..launching.launcher import launch
from ..launching.rankinfo import device, rank_info
from .failures import brief
from .inputs import (DoctorInputError, batch_for, call, default_loss, floating_tensors, move)
from .loader import eval_input
from .report import Finding

STEPS = 3  # SGD steps compared: a tie broken by the split shows from the second step on
LR = 0.1
LESSON = "16"


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


def relative(a, b, floor: float = 0.0) -> float:
    """|a - b| / |b|; `floor` keeps a value that is zero in exact arithmetic (the gradient of
    a key's bias under softmax) from turning rounding into a large relative error."""
    a = a.full_tensor() if hasattr(a, "full_tensor") else a
    return float((a - b).norm()) / (max(float(b.norm()), floor) or 1.0)


def ties(model) -> list[list[str]]:
    """Names that are one parameter (tied), in groups of two or more."""
    groups: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return sorted(g for g in groups.values() if len(g) > 1)


def untied(before: list, model) -> list[list[str]]:
    """The groups of `before` that are no longer one parameter in `model`."""
    after = dict(model.named_parameters(remove_duplicate=False))
    return [g for g in before if len({id(after.get(n)) for n in g}) > 1]


def compare(model, ref, batch, steps: int = STEPS) -> dict:
    """`steps` SGD steps of the split `model` and the whole `ref` on the same batch: each step's
    output, and the first step's gradients paired by NAME (tied names included), a gradient
    measured against 1 % of the largest gradient at least. A split parameter whose whole shape
    differs from the module's (a plain tensor sharded by hand) is left out of the gradients."""
    import torch

    opts = [torch.optim.SGD(m.parameters(), lr=LR, foreach=False) for m in (model, ref)]
    errors: dict = {}
    for step in range(steps):
        out, want = call(model, batch), call(ref, batch)
        errors[f"output at step {step + 1}"] = max(
            (relative(a, b) for a, b in zip(floating_tensors(out), floating_tensors(want))),
            default=0.0)
        for o in opts:
            o.zero_grad()
        default_loss(out).backward()
        default_loss(want).backward()
        if step == 0:
            errors.update(_gradients(model, ref))
        for o in opts:
            o.step()
    return errors


def _gradients(model, ref) -> dict:
    whole = dict(ref.named_parameters(remove_duplicate=False))
    pairs = [(n, p.grad, whole[n].grad) for n, p in model.named_parameters(remove_duplicate=False)
             if n in whole and p.grad is not None and whole[n].grad is not None
             and tuple(p.shape) == tuple(whole[n].shape)]
    floor = 0.01 * max((float(g.norm()) for _, _, g in pairs), default=0.0)
    return {f"gradient of {n}": relative(a, b, floor) for n, a, b in pairs}


def whole_bytes(model) -> tuple[int, list[str]]:
    """Parameter bytes (and names) that no split touched: plain tensors or Replicate()."""
    from torch.distributed.tensor import DTensor

    whole, names = 0, []
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor) or all(pl.is_replicate() for pl in p.placements):
            whole += p.numel() * p.element_size()
            names.append(name)
    return whole, names


def split(model, mesh, batch, given, parallelize) -> tuple[dict, str, dict]:
    """Split `model` as the user does: their `parallelize(model, mesh)` (parallelize_module and
    whatever they do after it), else the plan. (plan shown, its origin, {parameter name: the
    user's line that registered it during the split})."""
    from torch.distributed.tensor.parallel import parallelize_module

    with registrations(model) as placed:
        if parallelize is not None:
            parallelize(model, mesh)
            return {}, "yours: " + getattr(parallelize, "__name__", "parallelize") + "(model, mesh)", placed
        plan, origin = resolve_plan(model, batch, given)
        if plan:
            parallelize_module(model, mesh, as_styles(plan))
    return {n: style_name(s) for n, s in plan.items()}, origin, placed


def probe(source, example, given=None, parallelize=None, folder: str = "") -> dict:
    """One rank: split, compare over STEPS optimizer steps, then the checkpoint round trip
    (doctor/roundtrip.py) into `folder`; PyTorch's message if the split module fails."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from .roundtrip import dcp_round_trip

    dev, world = device(), rank_info().world_size
    mesh = init_device_mesh(dev.type, (world,))
    torch.manual_seed(0)  # the same weights on every rank
    model = source.build().to(dev)
    ref, tied = copy.deepcopy(model), ties(model)
    batch = move(batch_for(example, 0), dev)  # the same batch on every rank
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    out: dict = {}
    try:
        plan, origin, placed = split(model, mesh, batch, given, parallelize)
        out.update(plan=plan, origin=origin, placed=placed, parallelize=parallelize is not None)
        if not plan and parallelize is None:
            return out
        whole, names = whole_bytes(model)
        out.update(whole_share=whole / total, whole_names=names, untied=untied(tied, model),
                   errors=compare(model, ref, batch))
    except Exception as exc:  # PyTorch's own message is the evidence
        out.update(error=f"{type(exc).__name__}: {exc}", error_at=raised_at(exc))
        return out

    def fresh():
        torch.manual_seed(12345)
        m = source.build().to(dev)
        split(m, mesh, batch, given, parallelize)
        return m

    if folder:
        out["round_trip"] = dcp_round_trip(model, fresh, batch, folder)
    return out


def tensor_parallel_findings(source, example, world_size: int, timeout: float, given=None,
                             parallelize=None, where: dict | None = None):
    """Launch `probe` on `world_size` ranks; (RunResult, findings of lesson 16: the split, and
    the checkpoint round trip of the split module)."""
    import shutil
    import tempfile

    from .checks.roundtrip import judge_records
    from .checks.tp_parallelize import findings

    folder = tempfile.mkdtemp(prefix="ddp-lab-dcp-")
    try:
        run = launch(probe, source, example, given=given, parallelize=parallelize, folder=folder,
                     world_size=world_size, timeout=timeout, grace=2.0, label="doctor tp")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    values = [r.value for r in run.ranks if r.status == "ok" and r.value]
    if not values:
        first = run.root_cause.error if run.root_cause and run.root_cause.error else None
        why = f"{first.type}: {first.message}" if first else run.describe_failure()
        return run, [Finding("error", "tp-run-failed", LESSON, "the module could not be checked "
                             "under tensor parallelism", [brief(why)])]
    found = findings(values[0], world_size, where)
    trips = [v.get("round_trip") for v in values]
    if len(values) == world_size and all(trips):
        found += judge_records(trips, source, where, values[0].get("placed", {}))
    return run, found


@contextmanager
def registrations(model):
    """{parameter name: the user's frame (file, line, function)} for every parameter registered
    inside the block (torch.nn.modules.module.register_module_parameter_registration_hook,
    module.py:191 in torch 2.13): parallelize_module's distribute_module, a re-tie, a bias
    sharded by hand."""
    import sys

    from torch.nn.modules.module import register_module_parameter_registration_hook

    names = {id(m): n for n, m in model.named_modules()}
    placed: dict = {}

    def hook(module, name, param):
        if id(module) in names:
            site = user_site(sys._getframe(1))
            if site:
                placed[f"{names[id(module)]}.{name}".lstrip(".")] = site

    handle = register_module_parameter_registration_hook(hook)
    try:
        yield placed
    finally:
        handle.remove()


def _users(code) -> bool:
    """Is this code the user's (not torch's, Python's, a package's, the doctor's)?"""
    from .frames import own, ours_not_lessons
    from .trace import skipped

    name = code.co_filename.replace("\\", "/")
    return not (skipped(name) or own(name, code.co_name) or ours_not_lessons(name)
                or "/site-packages/" in name or "/lib/python3" in name)


def user_site(frame) -> tuple | None:
    """(file, line, function) of the innermost frame that is the user's code."""
    while frame is not None:
        if _users(frame.f_code):
            return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def raised_at(exc) -> tuple | None:
    """The user's innermost frame in `exc`'s traceback (the line that raised, in their code)."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        found = (code.co_filename, tb.tb_lineno, code.co_name) if _users(code) else found
        tb = tb.tb_next
    return found
