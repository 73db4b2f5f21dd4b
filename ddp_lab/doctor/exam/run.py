"""The doctor's run over its subject: the user's arguments validated into one `Subject`
(checks/api.py), the static checks on one instance here, then one phase after another, each
`phase(subject) -> (run, findings)`: the DDP phase (ddp.py), the checkpoint round trip
(save_load.py, under DDP in this process), the sharded or tensor-parallel launch (sharded.py,
tensor_parallel.py) and the compile launch (compile_run.py). The registry's checks among them
are judged through `judge(ev)` (ddp_lab/doctor/checks)."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from ..checks.api import Subject
from ..errors import DoctorInputError
from ..report import Finding, Report
from ..strategies import judged_under
from ..userline import code_map, code_of, code_ranges
from . import compile_run, ddp, inputs, save_load, shapes, sharded, static, tensor_parallel
from .settings import not_exercised, settings_note, validated_ddp_kwargs
from .tp_plan import validate_tp_args


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
    "fsdp2" or "zero3" adds the sharded checks of exam/sharded.py (one more launch, the
    module sharded); "tp" adds exam/tensor_parallel.py's check (one more launch, the module
    split by `tp_plan` or its own `tp_plan`,
    compared with the module whole over SGD steps);
    `parallelize=fn(model, mesh)` is your own split instead of a plan (parallelize_module and
    whatever you do after it). Every strategy but zero3 also saves and reloads the module as
    users do (exam/save_load.py: torch.save under ddp, torch.distributed.checkpoint under tp
    and fsdp2). `compile=True` adds the compile check (exam/compile_run.py, checks/compiled.py)
    (one more launch: the DDP steps under torch.compile, aot_eager); `compile={"fullgraph": True,
    "dynamic": False, "backend": "aot_eager", "mode": None}` compiles as you do (backend
    inductor by default, as torch.compile's; aot_eager where no C++ compiler is found, said in
    the report's notes). `timeout` bounds the launch:
    a module that hangs is reported with each rank's stack. Raises
    DoctorInputError (the CLI's exit status 2) when the doctor cannot start: a factory that
    raises, an input that does not fit, no parameters, bad settings; DoctorBug (exit status 3)
    when the doctor's own code fails on a rank.
    """
    start = time.time()
    _validate_args(world_size, steps, timeout)
    if strategy not in sharded.STRATEGIES:
        raise DoctorInputError(f"strategy must be one of {', '.join(sharded.STRATEGIES)}, got {strategy!r}")
    validate_tp_args(strategy, tp_plan, amp, parallelize)
    inputs.validate_amp(amp)
    inputs.validate_loss(loss_fn)
    settings = validated_ddp_kwargs(ddp_kwargs)
    compiling = compile_run.settings_of(compile)
    source = inputs.resolve_model(model)
    instance = inputs.first_instance(source)
    findings = static.static_findings(instance)
    _require_trainable(instance, source.name, findings)
    loss = inputs.Loss(loss_fn)
    out = inputs.validate_fit(instance, inputs.batch_for(example_input, 0), source.name, amp, loss_fn)
    plan = shapes.plan(instance, example_input, amp) if world_size > 1 else None
    where = code_map(instance)
    if parallelize is not None:  # the user's split, named by its file on the ranks too
        where.update(code_of(parallelize))
    ranges = code_ranges(instance, where)
    del instance
    subject = Subject(source, example_input, world_size, steps, loss, amp, settings, strategy,
                      plan, tp_plan, parallelize, compiling, timeout, where, ranges)
    notes = [loss.describe(out), shapes.describe(example_input, plan, world_size),
             settings_note(settings), not_exercised(steps, amp, strategy)]
    run, found = examine(subject, notes)
    return Report(source.name, world_size, steps, amp, judged_under(findings + found, strategy),
                  status=run.status, seconds=time.time() - start, run=run, ddp_kwargs=settings,
                  notes=notes, strategy=strategy)


def examine(subject: Subject, notes: list[str]):
    """(the DDP phase's RunResult, every phase's findings): the phases the subject asks for, in
    order; the compile phase's note is added to `notes`."""
    run, found = ddp.phase(subject)
    if subject.strategy == "ddp":  # the checkpoint round trip; tp, fsdp2: in their launch
        found += save_load.phase(subject)[1]
    if subject.strategy == "tp":
        found += tensor_parallel.phase(subject)[1]
    elif subject.strategy != "ddp":
        found += sharded.phase(subject)[1]
    if subject.compile:
        notes.append(_compile(subject, run, found))
    return run, found


def _compile(subject: Subject, run, found: list[Finding]) -> str:
    """Adds the compile phase's findings to `found`; the report's note about it."""
    if run.status != "ok":
        return "compile: not checked, the DDP phase did not run through"
    unused = any(f.code.endswith("unused-parameters") for f in found)
    settings = dict(subject.ddp_kwargs)
    settings["find_unused_parameters"] = bool(settings.get("find_unused_parameters")) or unused
    found += compile_run.phase(replace(subject, ddp_kwargs=settings))[1]
    return compile_run.note(subject.compile, subject.steps)


def _validate_args(world_size, steps, timeout) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise DoctorInputError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(steps, int) or steps < 1:
        raise DoctorInputError(f"steps must be an integer >= 1, got {steps!r}")
    if not isinstance(timeout, (int, float)) or timeout < 3:
        raise DoctorInputError(f"timeout must be at least 3 seconds, got {timeout!r}")


def _require_trainable(instance, name: str, findings: list[Finding]) -> None:
    """No parameter at all is bad input, unless the static checks already explain why (the
    trainable tensors are there, just not registered)."""
    if any(p.requires_grad for p in instance.parameters()):
        return
    if any(f.severity == "error" and f.lesson == "01" for f in findings):
        return
    raise DoctorInputError(f"{name} has no parameter that requires a gradient: there is nothing "
                           "for DDP to synchronise (DDP refuses such a module)")
