"""`ddp_lab.doctor`: point it at your own module and it tells you, before a real training run
does, which of the course's error classes the module has, with the evidence and the fix.

    report = ddp_lab.doctor(MyModule, torch.randn(8, 16))
    report            # a table in Jupyter, text in a terminal
    report.errors     # the error-level findings; report.exit_status is 1 when there are any

Static checks look at one instance here; every dynamic check runs in ONE launch of
`world_size` real ranks (ddp_lab.launch) under DDP. Command line:
`ddp-lab doctor path/to/file.py:Name --input "torch.randn(8, 16)"`.
"""
from __future__ import annotations

import time
from typing import Callable

from .failures import DoctorBug
from .inputs import DoctorInputError
from .report import LESSONS, Finding, Report

__all__ = ["doctor", "Report", "Finding", "DoctorInputError", "DoctorBug", "LESSONS"]
GRACE = 2.0  # seconds the other ranks get after one fails before their stacks are taken


def doctor(model, example_input, *, world_size: int = 2, steps: int = 3,
           loss_fn: Callable | None = None, amp: str | None = None,
           timeout: float = 60, strategy: str = "ddp") -> Report:
    """Diagnose `model` (an nn.Module class, a zero-argument factory, or an instance) fed with
    `example_input` (a tensor, a tuple of forward's positional arguments, a dict of its keyword
    arguments, or a callable rank -> batch; a fixed input is perturbed per rank).

    Without `loss_fn(output)` the loss is the sum of every floating-point tensor in the output
    (tensor, tuple or dict), weighted element-wise by fixed random numbers. `amp` ("bf16" or
    "fp16") runs forward under torch.autocast. `strategy` "fsdp2" or "zero3" adds the sharded
    checks of doctor/sharded.py (one more launch, the module sharded). `timeout` bounds the launch: a module that hangs
    is reported with each rank's stack. Raises DoctorInputError (the CLI's exit status 2) when
    the doctor cannot start: a factory that raises, an input that does not fit, no parameters;
    DoctorBug (exit status 3) when the doctor's own code fails on a rank.
    """
    from . import inputs, static

    start = time.time()
    _check_args(world_size, steps, timeout)
    _check_strategy(strategy)
    inputs.check_amp(amp)
    source = inputs.resolve_model(model)
    instance = inputs.first_instance(source)
    findings = static.check(instance)
    _check_trainable(instance, source.name, findings)
    inputs.check_fit(instance, inputs.batch_for(example_input, 0), source.name, amp, loss_fn)
    del instance
    run, dynamic = _run_ranks(source, example_input, world_size, steps, loss_fn, amp, timeout)
    if strategy != "ddp":
        from .sharded import check
        dynamic += check(source, example_input, strategy, world_size, timeout)[1]
    return Report(source.name, world_size, steps, amp, findings + dynamic, status=run.status,
                  seconds=time.time() - start, run=run)


def _check_args(world_size, steps, timeout) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise DoctorInputError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(steps, int) or steps < 1:
        raise DoctorInputError(f"steps must be an integer >= 1, got {steps!r}")
    if not isinstance(timeout, (int, float)) or timeout < 3:
        raise DoctorInputError(f"timeout must be at least 3 seconds, got {timeout!r}")


def _check_strategy(strategy) -> None:
    from .sharded import STRATEGIES

    if strategy not in STRATEGIES:
        raise DoctorInputError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")


def _check_trainable(instance, name: str, findings: list[Finding]) -> None:
    """No parameter at all is bad input, unless the static checks already explain why (the
    trainable tensors are there, just not registered)."""
    if any(p.requires_grad for p in instance.parameters()):
        return
    if any(f.severity == "error" and f.lesson == "01" for f in findings):
        return
    raise DoctorInputError(f"{name} has no parameter that requires a gradient: there is nothing "
                           "for DDP to synchronise (DDP refuses such a module)")


def _run_ranks(source, example, world_size, steps, loss_fn, amp, timeout):
    from ..launcher import launch
    from .analyze import dry_findings
    from .dynamic import probe
    from .failures import failure_findings
    from .measure import measure_findings, step_collective_findings
    from .sync import records

    # INFO (never DETAIL: DETAIL with DDP crashes ranks on some builds) makes DDP name the
    # parameters that received no gradient in its error message.
    run = launch(probe, source, example, steps=steps, loss_fn=loss_fn, amp=amp,
                 world_size=world_size, timeout=timeout, grace=GRACE,
                 env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, label="doctor")
    recs = [records(r.stdout) for r in run.ranks]
    unused = set().union(*[set((r.get("dry") or {}).get("unused", [])) for r in recs])
    findings = dry_findings(recs, amp) + failure_findings(run, recs, amp)
    if recs and recs[0]:
        findings += measure_findings(recs[0], steps, unused) + step_collective_findings(recs)
    return run, _dedupe(findings)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (code, lesson): the first (the more specific check) keeps its place."""
    seen, out = set(), []
    for f in findings:
        key = (f.code, f.lesson, f.title)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
