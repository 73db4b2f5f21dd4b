"""The doctor's sharded checks (`strategy="fsdp2"` or `"zero3"`): where a custom module's
weights are read once each unit holds only its shard.

Every rank builds the module, plans the units as FSDP2 users usually do (each direct child
that holds parameters, then the root), and, on the bare module, records with forward hooks
and a TorchFunctionMode which parameter each op reads while which unit's forward runs. Then
it shards the module for real (`fully_shard`, or `deepspeed.initialize` with ZeRO stage 3)
and runs a forward and backward, keeping PyTorch's (or DeepSpeed's) own message.
"""
from __future__ import annotations

from ...instruments.compilewatch import caller
from ...instruments.deepspeed_ops import require_built
from ...launching.cuda_init import gpu_count
from ...launching.rankinfo import rank_info
from ..batch import call
from ..frames import SLASHED_OWN
from ..report import Finding, brief
from ..userline import at_line
from .inputs import batch_for, default_loss
from .launch import failure, launch_and_judge, ranges_of
from .precision import (low_precision_tables, reference, relative_error, same_weights,
                        table_findings)
from .save_load import fsdp2_round_trip

STRATEGIES = ("ddp", "fsdp2", "zero3", "tp")  # "tp": tensor_parallel.py


def plan(model) -> list:
    """The units: every direct child with parameters, then the root."""
    return [c for c in model.children() if any(True for _ in c.parameters())] + [model]


def owners(model, units) -> dict:
    """id(parameter) -> names of the units that register it (innermost unit owns it)."""
    names = {id(m): n or "<root>" for n, m in model.named_modules()}
    found: dict = {}
    for unit in units:
        inner = {id(p) for u in units if u is not unit and u in set(unit.modules())
                 for p in u.parameters()}
        for _, p in unit.named_parameters(remove_duplicate=False):
            if id(p) not in inner:
                found.setdefault(id(p), []).append(names[id(unit)])
    return {k: sorted(set(v)) for k, v in found.items()}


def watched_reads(model, units, batch, own: dict) -> list[tuple[str, str, str]]:
    """(parameter, owning unit, unit whose forward read it) for each read of a parameter
    while its own unit's forward was not running."""
    import sys

    import torch
    from torch.overrides import TorchFunctionMode

    names = {id(m): n or "<root>" for n, m in model.named_modules()}
    pnames = {id(p): n for n, p in model.named_parameters()}
    active: list[str] = []
    seen: set = set()

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            for a in list(args) + list((kwargs or {}).values()):
                if isinstance(a, torch.nn.Parameter) and id(a) in own:
                    if not set(own[id(a)]) & set(active):
                        seen.add((pnames.get(id(a), "?"), own[id(a)][0], active[-1] if active else "-",
                                  caller(sys._getframe(1), SLASHED_OWN)))
            return func(*args, **(kwargs or {}))

    def enter(module, args):
        active.append(names[id(module)])

    def leave(module, args, output):
        active.pop()

    handles = [h for u in units for h in (u.register_forward_pre_hook(enter),
                                           u.register_forward_hook(leave))]
    try:
        with Reads():
            call(model, batch)
    finally:
        for h in handles:
            h.remove()
    return sorted(seen)


def mixed_grad_units(model, units, own: dict) -> list[str]:
    names = {id(m): n or "<root>" for n, m in model.named_modules()}
    mixed = []
    for unit in units:
        flags = {p.requires_grad for p in unit.parameters() if names[id(unit)] in own.get(id(p), [])}
        if len(flags) == 2:
            mixed.append(names[id(unit)])
    return mixed


def sharded_step(model, units, batch, strategy: str, amp: str | None = None,
                 seen: dict | None = None) -> str | None:
    """One forward and backward with the module really sharded; the exception's first line.
    Under FSDP2, `amp` ("bf16"/"fp16") is FSDP2's MixedPrecisionPolicy(param_dtype=...); with
    `seen` (holding "reference": the float32 outputs) the bf16 tables check records into it."""
    try:
        if strategy == "fsdp2":
            out = _fsdp2_forward(model, units, batch, amp, seen)
            default_loss(out).backward()
        else:
            if not __import__("torch").cuda.is_available():
                require_built()
            import deepspeed
            deepspeed.init_distributed(dist_backend="gloo")
            cfg = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
                   "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
            opt = __import__("torch").optim.SGD(model.parameters(), lr=1e-3)
            engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
            engine.backward(default_loss(call(engine, batch)))
    except Exception as exc:  # PyTorch's or DeepSpeed's own message is the evidence
        return f"{type(exc).__name__}: {exc}"
    return None


def _fsdp2_forward(model, units, batch, amp, seen: dict | None):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    for unit in units:
        fully_shard(unit, mp_policy=MixedPrecisionPolicy(param_dtype=dtype))
    if seen is None:
        return call(model, batch)
    with low_precision_tables() as tables:
        out = call(model, batch)
    seen["bf16_error"] = relative_error(out, seen.pop("reference"))
    seen["bf16_tables"] = tables.calls
    return out


def probe(subject, folder: str = "") -> dict:
    """What one rank sees: ties across units, reads outside a unit's forward, mixed
    requires_grad, and the sharded run's own error; then the round trip into `folder`."""
    import torch

    source, example, strategy, amp = subject.source, subject.example, subject.strategy, subject.amp
    rank = rank_info().rank
    torch.manual_seed(1000 + rank)
    with ParameterSites() as assigned:
        model = source.build()
    units = plan(model)
    own = owners(model, units)
    pnames = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    batch = batch_for(example, rank)
    seen = _bf16_reference(model, batch) if (strategy, amp) == ("fsdp2", "bf16") else None
    found = {"shared": sorted((pnames[k], v) for k, v in own.items() if len(v) > 1),
             "tied_at": {pnames[k]: assigned.sites[k][-1] for k, v in own.items()
                         if len(v) > 1 and len(assigned.sites.get(k, [])) > 1},
             "reads": watched_reads(model, units, batch, own),
             "mixed": mixed_grad_units(model, units, own),
             "error": sharded_step(model, units, batch, strategy, amp, seen)}
    (seen or {}).pop("reference", None)  # tensors: only plain data leaves a rank
    if folder and strategy == "fsdp2" and not found["error"]:  # save_load.py
        found["round_trip"] = fsdp2_round_trip(source, batch, folder)
    return {**found, **(seen or {})}


def _bf16_reference(model, batch) -> dict:
    """Rank 0's weights everywhere, and the module's float32 outputs run whole with them."""
    same_weights(model)
    return {"reference": reference(model, batch)}


def phase(subject):
    """(RunResult, findings) of the sharded launch: the sharded checks (lesson 12), FSDP2's bf16
    tables, and under FSDP2 the registry's roundtrip check."""
    strategy = subject.strategy
    if strategy == "zero3" and gpu_count() == 0:
        # DeepSpeed's op missing or stale is this environment's error, not the module's: refused
        # here, naming `ddp-lab build-ops`, before a rank would compile it (issue 47)
        require_built()
    failed = failure("sharded-run-failed", "12", f"the module could not be checked under {strategy}",
                     fix="see the message: the rank failed before the checks could run")
    run, ev, found = launch_and_judge(probe, subject, f"doctor {strategy}", ("roundtrip",), failed)
    if ev is None:
        return run, found
    first = next(v for v in ev.ranks if v)
    return run, findings(first, strategy, ranges_of(subject)) + found


FIX_TIE = ("keep the tie inside one unit (a child module that owns the weight and both uses "
           "of it), or shard the modules that share it as one unit: fully_shard([a, b])")


FIX_DTYPE = ("FSDP2's MixedPrecisionPolicy casts parameters and each unit's floating-point "
             "inputs, not buffers or tensors the module keeps: they stay float32 and turn "
             "activations back to float32; compute with them in float32 and cast the result to "
             "the activation's dtype (h.dtype)")


class ParameterSites:
    """Where each Parameter object is assigned to a module attribute while the module is built
    (nn.Module.__setattr__, torch/nn/modules/module.py): a tie is the second assignment of one
    Parameter, and that line is the user's."""

    def __init__(self):
        self.sites: dict[int, list[str]] = {}

    def __enter__(self):
        import sys

        import torch

        self._original = original = torch.nn.Module.__setattr__

        def assigning(module, name, value):
            if isinstance(value, torch.nn.Parameter):
                self.sites.setdefault(id(value), []).append(caller(sys._getframe(1), SLASHED_OWN))
            original(module, name, value)

        torch.nn.Module.__setattr__ = assigning
        return self

    def __exit__(self, *exc):
        import torch

        torch.nn.Module.__setattr__ = self._original


def findings(v: dict, strategy: str, where: dict | None = None) -> list[Finding]:
    out = table_findings(v)
    error = [f"{'PyTorch' if strategy == 'fsdp2' else 'DeepSpeed'} said: {brief(v['error'])}"] \
        if v["error"] else []
    if v["shared"] and strategy == "fsdp2":
        out.append(Finding("error", "weight-shared-across-units", "12",
                           "a parameter is registered in two FSDP2 units",
                           [f"{name}: units {', '.join(u)}" for name, u in v["shared"]] + error,
                           fix=FIX_TIE, where=next((at_line(v.get("tied_at", {})[n], where)
                                                    for n, _ in v["shared"]
                                                    if n in v.get("tied_at", {})), "")))
    if v["reads"]:
        severity = "error" if strategy == "fsdp2" else "info"
        out.append(Finding(severity, "read-outside-its-unit", "12",
                           "parameters read outside their own unit's forward",
                           [f"{p} (unit {o}) read in the forward of {r}" for p, o, r, _ in v["reads"]]
                           + (error if severity == "error" else
                              ["ZeRO-3 gathers it as an external parameter of the reader"]),
                           fix=FIX_TIE + "; in a training loop, read weight.full_tensor() "
                               "(FSDP2) or inside deepspeed.zero.GatheredParameters (ZeRO-3)",
                           where=next((at_line(at, where) for *_, at in v["reads"] if at), "")))
    if v["mixed"]:  # measured in lesson 12 (frozen_part_in_unit): nothing to fix under FSDP2
        out.append(Finding("info", "mixed-requires-grad", "12",
                           "frozen and trainable parameters share a unit",
                           [f"unit {u}" for u in v["mixed"]] +
                           ["FSDP2 accepts it: it all-gathers the frozen parameters for forward "
                            "and backward and never reduce-scatters them (lesson 12 measures it)"],
                           fix="nothing to change; freeze with requires_grad_(False), not by "
                               "leaving the parameters out of the optimizer"))
    if v["error"] and not [f for f in out if f.lesson == "12"]:
        dtype = "must have the same dtype" in v["error"]
        out.append(Finding("error", "sharded-run-failed", "12",
                           f"forward/backward fails with the module sharded ({strategy})", error,
                           fix=FIX_DTYPE if dtype else ""))
    return out
