"""The doctor's tensor-parallel phase (`strategy="tp"`): the module split on real ranks as the
user splits it, beside the same module whole; then the split module's checkpoint round trip.

Every rank builds the module from the same seed, keeps a whole copy, splits the module and
feeds both the SAME batch (tensor parallelism splits weights, not the batch) for STEPS SGD
steps, recording each step's output and the first step's gradients paired by name. The split
is the user's own `parallelize(model, mesh)` (parallelize_module and whatever they do after
it: re-tying weights, a bias sharded by hand), else a plan (tp_plan.py: `tp_plan`, else the
module's own `tp_plan()` or `tp_plan` dict, as Hugging Face models carry `_tp_plan`); with
none, nothing is split (the check says it needs a plan). Findings are built by the registry's
checks tp_parallelize and roundtrip.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager

from ...launching.rankinfo import device, rank_info
from ..batch import call, floating_tensors, move
from ..frames import raised_at, user_site
from .inputs import batch_for, default_loss
from .launch import failure, launch_and_judge
from .save_load import dcp_round_trip
from .tp_plan import as_styles, resolve_plan, style_name

STEPS = 3  # SGD steps compared: a tie broken by the split shows from the second step on
LR = 0.1
LESSON = "16"


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


def probe(subject, folder: str = "") -> dict:
    """One rank: split, compare over STEPS optimizer steps, then the checkpoint round trip
    (save_load.py) into `folder`; PyTorch's message if the split module fails."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    source, example = subject.source, subject.example
    given, parallelize = subject.tp_plan, subject.parallelize
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


def phase(subject):
    """(RunResult, findings of lesson 16): the split judged by the registry's tp_parallelize
    check, and the split module's checkpoint round trip by its roundtrip check."""
    failed = failure("tp-run-failed", LESSON, "the module could not be checked under tensor "
                     "parallelism")
    run, _, found = launch_and_judge(probe, subject, "doctor tp", ("tp_parallelize", "roundtrip"),
                                     failed)
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
