"""The diagnostic wing: `ddp_lab.doctor` (a user's nn.Module checked on real ranks) and
`ddp_lab.watch` (a user's training script, unchanged, checked on real ranks), and everything they
share. This package is the face: its public names are below; what lives where is this manual.

    report = ddp_lab.doctor(MyModule, torch.randn(8, 16))      # exam/run.py
    report = ddp_lab.watch("train.py", args=["--epochs", "1"])  # watch/
    report            # a table in Jupyter, text in a terminal
    report.errors     # the error-level findings; report.exit_status is 1 when there are any

The floors, each importing only those below it (tests/doctor/test_wing_layers.py holds them):

    __init__, __main__, cli   the face: the public names, `ddp-lab doctor` (cli.py)
    exam/  watch/             the tools. exam/: the doctor's run over its `Subject`, one phase
                              per module (`phase(subject) -> (run, findings)`): ddp (the DDP
                              launch: dynamic's probe, analyze, randomness, mechanisms, measure,
                              failures), save_load (the checkpoint round trip), sharded,
                              tensor_parallel (+ tp_plan), compile_run; static checks, inputs,
                              shapes, settings. watch/: the core on each rank (core.py), a script
                              run (script.py, torchrun.py; as_main.py runs the script as Python
                              does, steps.py times each step, console.py shows its output,
                              reference_run.py the --reference run), the function API (__init__, rank.py, instruments.py,
                              function_checks.py), `ddp-lab watch` (command.py).
                              Neither imports the other.
    checks/                   the registry: one module per check (`CHECK = Check(...)`), judged
                              through `judge(name, ev)`; its floor, checks/api.py (Check,
                              Evidence, Subject, Finding, Context, RANK_KEYS) and context.py.
                              Imports no tool.
    report, render, strategies, frames, userline, batch, errors, sync, loader
                              the ground: findings and reports, whose rule a finding is, which
                              frame is the user's (frames.py) and the user's line, written one
                              way (userline.py), tensors in a batch, the exceptions, the ranks'
                              records on stdout, the CLIs' loading of `file.py:Name`.

Below the wing: ddp_lab.launching, ddp_lab.instruments and the registry of lessons
(ddp_lab.course.registry); never a lesson (the lessons a finding points to are named by number).
Adding a check: README.md here.
"""
from __future__ import annotations

import inspect
import sys
import types

from .errors import DoctorBug, DoctorInputError
from .exam.run import doctor
from .report import LESSONS, Finding, Report

__all__ = ["doctor", "Report", "Finding", "DoctorInputError", "DoctorBug", "LESSONS"]


class _CallablePackage(types.ModuleType):
    """This package, callable as the function `doctor`: `ddp_lab` exports the package itself,
    so `from ddp_lab import doctor; doctor(Net, x)` and `ddp_lab.doctor(Net, x)` call the
    function, and `import ddp_lab.doctor.exam.sharded as s` finds the submodule (when
    `ddp_lab.doctor` was the function, Python's `import a.b.c as x` read `.exam` off the
    function and failed)."""

    def __call__(self, *args, **kwargs) -> Report:
        return doctor(*args, **kwargs)


__signature__ = inspect.signature(doctor)  # what help() and Jupyter's `doctor?` show for a call
sys.modules[__name__].__class__ = _CallablePackage
