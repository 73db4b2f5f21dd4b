"""`ddp_lab.doctor`: point it at your own module and it tells you, before a real training run
does, which of the course's error classes the module has, with the evidence and the fix.

    report = ddp_lab.doctor(MyModule, torch.randn(8, 16))
    report            # a table in Jupyter, text in a terminal
    report.errors     # the error-level findings; report.exit_status is 1 when there are any

Static checks look at one instance here; every dynamic check runs in ONE launch of
`world_size` real ranks (ddp_lab.launch) under DDP. Command line:
`ddp-lab doctor path/to/file.py:Name --input "torch.randn(8, 16)"`. Adding a check: README.md here.

May import: ddp_lab.launching, ddp_lab.instruments and the registry (ddp_lab.course.registry);
never a lesson (the lessons a finding points to are named by number).
"""
from __future__ import annotations

import inspect
import sys
import time
import types
from typing import Callable

from .inputs import DoctorBug, DoctorInputError
from .report import LESSONS, Finding, Report
from .strategies import judged_under
from .settings import not_exercised, settings_note, validated_ddp_kwargs

__all__ = ["doctor", "Report", "Finding", "DoctorInputError", "DoctorBug", "LESSONS"]
GRACE = 2.0  # seconds the other ranks get after one fails before their stacks are taken


def doctor(model, example_input, *, world_size: int = 2, steps: int = 3,
           loss_fn: Callable | None = None, amp: str | None = None,
           ddp_kwargs: dict | None = None, timeout: float = 60,
           strategy: str = "ddp", compile: bool | dict = False, tp_plan=None,
           parallelize: Callable | None = None) -> Report:
    """Diagnose `model` (an nn.Module class, a zero-argument factory, or an instance) fed with
    `example_input` (a tensor, a tuple of forward's positional arguments, a dict of its keyword
    arguments, or a callable rank -> batch). A fixed input is perturbed per rank, and cut to
    another length along a non-batch dimension on odd ranks where the module accepts one.

    `loss_fn(output)` or `loss_fn(output, batch)` is your training loss; without it the loss
    is every floating-point tensor of the output, weighted element-wise by fixed random numbers
    (the report says so). `ddp_kwargs` are your DistributedDataParallel settings (e.g.
    `{"find_unused_parameters": True}`): the module is judged under them. `steps` DDP training
    steps are run. `amp` ("bf16" or "fp16") runs forward under torch.autocast. `strategy`
    "fsdp2" or "zero3" adds the sharded checks of doctor/sharded.py (one more launch, the
    module sharded); "tp" adds doctor/tensor_parallel.py's check (one more launch, the module
    split by `tp_plan` or its own `tp_plan`,
    compared with the module whole over SGD steps);
    `parallelize=fn(model, mesh)` is your own split instead of a plan (parallelize_module and
    whatever you do after it). Every strategy but zero3 also saves and reloads the module as
    users do (doctor/roundtrip.py: torch.save under ddp, torch.distributed.checkpoint under tp
    and fsdp2). `compile=True` adds the compile check of doctor/compiled.py
    (one more launch: the DDP steps under torch.compile, aot_eager); `compile={"fullgraph": True,
    "dynamic": False, "backend": "aot_eager", "mode": None}` compiles as you do (backend
    inductor by default, as torch.compile's; aot_eager where no C++ compiler is found, said in
    the report's notes). `timeout` bounds the launch:
    a module that hangs is reported with each rank's stack. Raises
    DoctorInputError (the CLI's exit status 2) when the doctor cannot start: a factory that
    raises, an input that does not fit, no parameters, bad settings; DoctorBug (exit status 3)
    when the doctor's own code fails on a rank.
    """
    from . import frames, inputs, shapes, static
    from .roundtrip import code_of

    start = time.time()
    _validate_args(world_size, steps, timeout)
    _validate_strategy(strategy)
    _validate_tp(strategy, tp_plan, amp, parallelize)
    inputs.validate_amp(amp)
    inputs.validate_loss(loss_fn)
    settings = validated_ddp_kwargs(ddp_kwargs)
    compiling = _compile_settings(compile)
    source = inputs.resolve_model(model)
    instance = inputs.first_instance(source)
    findings = static.static_findings(instance)
    _require_trainable(instance, source.name, findings)
    loss = inputs.Loss(loss_fn)
    out = inputs.validate_fit(instance, inputs.batch_for(example_input, 0), source.name, amp, loss_fn)
    plan = shapes.plan(instance, example_input, amp) if world_size > 1 else None
    where = frames.code_map(instance)
    if parallelize is not None:  # the user's split, named by its file on the ranks too
        where.update(code_of(parallelize))
    del instance
    notes = [loss.describe(out), shapes.describe(example_input, plan, world_size),
             settings_note(settings), not_exercised(steps, amp)]
    run, dynamic = _run_ranks(source, example_input, world_size, steps, loss, amp, timeout,
                              settings, plan, where)
    if strategy == "ddp":  # the checkpoint round trip (doctor/roundtrip.py); tp, fsdp2: their launch
        from .checks.roundtrip import torch_save_findings
        dynamic += torch_save_findings(source, example_input, where)
    if strategy == "tp":
        from .tensor_parallel import tensor_parallel_findings
        dynamic += tensor_parallel_findings(source, example_input, world_size, timeout, tp_plan,
                                            parallelize, where)[1]
    elif strategy != "ddp":
        from .sharded import sharded_findings
        dynamic += sharded_findings(source, example_input, strategy, world_size, timeout, amp,
                                    where)[1]
    if compiling:
        notes.append(_compile_check(dynamic, run, source, example_input, steps, loss, amp,
                                    settings, plan, world_size, timeout, where, compiling))
    return Report(source.name, world_size, steps, amp, judged_under(findings + dynamic, strategy),
                  status=run.status, seconds=time.time() - start, run=run, ddp_kwargs=settings,
                  notes=notes, strategy=strategy)


def _compile_check(found, run, source, example, steps, loss, amp, settings, plan, world_size,
                   timeout, where, compiling) -> str:
    """Adds the compile check's findings to `found`; the report's note about it."""
    if run.status != "ok":
        return "compile: not checked, the DDP phase did not run through"
    from .compiled import compiled_findings, note

    unused = any(f.code.endswith("unused-parameters") for f in found)
    settings = {**settings, "find_unused_parameters": bool(settings.get("find_unused_parameters")) or unused}
    found += compiled_findings(source, example, steps, loss, amp, settings, plan, world_size,
                               timeout, where, compiling)
    return note(compiling, steps)


def _compile_settings(compile) -> dict | None:
    from .compiled import settings_of

    return settings_of(compile)


def _validate_args(world_size, steps, timeout) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise DoctorInputError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(steps, int) or steps < 1:
        raise DoctorInputError(f"steps must be an integer >= 1, got {steps!r}")
    if not isinstance(timeout, (int, float)) or timeout < 3:
        raise DoctorInputError(f"timeout must be at least 3 seconds, got {timeout!r}")


def _validate_strategy(strategy) -> None:
    from .sharded import STRATEGIES

    if strategy not in STRATEGIES:
        raise DoctorInputError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")


def _validate_tp(strategy, tp_plan, amp, parallelize=None) -> None:
    from .tensor_parallel import validate_tp_args

    validate_tp_args(strategy, tp_plan, amp, parallelize)


def _require_trainable(instance, name: str, findings: list[Finding]) -> None:
    """No parameter at all is bad input, unless the static checks already explain why (the
    trainable tensors are there, just not registered)."""
    if any(p.requires_grad for p in instance.parameters()):
        return
    if any(f.severity == "error" and f.lesson == "01" for f in findings):
        return
    raise DoctorInputError(f"{name} has no parameter that requires a gradient: there is nothing "
                           "for DDP to synchronise (DDP refuses such a module)")


def _run_ranks(source, example, world_size, steps, loss, amp, timeout, settings, plan, where):
    from ..launching.launcher import launch
    from .analyze import dry_findings
    from .dynamic import probe
    from .failures import failure_findings
    from .measure import measure_findings, step_collective_findings
    from .mechanisms import mechanism_findings
    from .sync import records

    # INFO, not DETAIL: on this build a process group created under DETAIL crashes DDP (a bug
    # of torch 2.13's wrapped group); INFO already makes DDP name the parameters without grad.
    run = launch(probe, source, example, steps=steps, loss=loss, amp=amp, ddp_kwargs=settings,
                 plan=plan, world_size=world_size, timeout=timeout, grace=GRACE,
                 env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, label="doctor")
    recs = [records(r.stdout) for r in run.ranks]
    unused = set().union(*[set((r.get("dry") or {}).get("unused", [])) for r in recs])
    mechanisms, explained = mechanism_findings(recs, steps)
    findings = dry_findings(recs, amp, settings) + mechanisms
    findings = _merge_failure(findings, failure_findings(run, recs, amp, where))
    if recs and recs[0]:
        findings += (measure_findings(recs[0], steps, unused, explained)
                     + step_collective_findings(recs))
    return run, _dedupe(findings)


def _merge_failure(findings: list[Finding], failures: list[Finding]) -> list[Finding]:
    """An exception a mechanism finding already explains (DDP refusing ranks whose models
    differ) joins that finding as evidence, with its trace, instead of standing alone."""
    structural = [f for f in findings if f.code in STRUCTURAL]
    shapes = [f for f in findings if f.code == "state-shape-follows-input" and "buffer" in f.title]
    out = list(findings)
    for f in failures:
        if f.code in STRUCTURAL and structural:
            target = structural[0]
        elif shapes and any(s in f.trace for s in ("_pre_forward", "_sync_buffers", "_sync_module")):
            target = shapes[0]  # DDP's buffer broadcast failed on the buffers' shapes
        else:
            out.append(f)
            continue
        target.severity = "error"
        target.evidence += ["the run then failed: " + e.removeprefix("then ") for e in f.evidence]
        target.trace = target.trace or f.trace
    return out


STRUCTURAL = ("model-differs-between-ranks", "requires-grad-differs-between-ranks")


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (code, lesson): the first (the more specific check) keeps its place."""
    seen, out = set(), []
    for f in findings:
        key = (f.code, f.lesson, f.title)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


class _CallablePackage(types.ModuleType):
    """This package, callable as the function `doctor`: `ddp_lab` exports the package itself,
    so `from ddp_lab import doctor; doctor(Net, x)` and `ddp_lab.doctor(Net, x)` call the
    function, and `import ddp_lab.doctor.sharded as s` finds the submodule (when `ddp_lab.doctor`
    was the function, Python's `import a.b.c as x` read `.sharded` off the function and failed)."""

    def __call__(self, *args, **kwargs) -> Report:
        return doctor(*args, **kwargs)


__signature__ = inspect.signature(doctor)  # what help() and Jupyter's `doctor?` show for a call
sys.modules[__name__].__class__ = _CallablePackage
