"""Launch a phase's probe on the subject's ranks and judge what they return with the registry's
checks: the tail the sharded and tensor-parallel phases share (a checkpoint folder for their
round trip, the ranks' values, one Evidence, each check through `judge(ev)`)."""
from __future__ import annotations

import shutil
import tempfile

from ...launching.launcher import launch
from ..checks import judge
from ..checks.api import Evidence, Finding
from ..report import brief
from ..userline import code_ranges

GRACE = 2.0


def launch_and_judge(probe, subject, label: str, checks: tuple, failed):
    """(RunResult, Evidence or None, findings): `probe(subject, folder)` on every rank (`folder`:
    a checkpoint folder of this launch's own, removed after it), then `checks` judged on the
    ranks' values (a rank that failed gives {}). When no rank returned a value, the Evidence is
    None and the findings are `failed(why)`, `why` the root cause's message cut short."""
    folder = tempfile.mkdtemp(prefix="ddp-lab-dcp-")  # the round trip's checkpoint
    try:
        run = launch(probe, subject, folder, world_size=subject.world_size,
                     timeout=subject.timeout, grace=GRACE, label=label)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    values = [r.value if r.status == "ok" and r.value else {} for r in run.ranks]
    if not any(values):
        first = run.root_cause.error if run.root_cause and run.root_cause.error else None
        why = f"{first.type}: {first.message}" if first else run.describe_failure()
        return run, None, failed(brief(why))
    ev = Evidence(values, run=run, world_size=subject.world_size, subject=subject)
    return run, ev, [f for name in checks for f in judge(name, ev)]


def failure(code: str, lesson: str, title: str, fix: str = "", strategies: tuple = ()):
    """A `failed` for launch_and_judge: one error finding with the root cause as evidence."""
    return lambda why: [Finding("error", code, lesson, title, [why], fix=fix, strategies=strategies)]


def ranges_of(subject) -> dict:
    """The subject's code ranges (userline.code_ranges): doctor() finds them on its first
    instance; for a Subject made without them, on a fresh one (or the code map alone when the
    module cannot be built here)."""
    if subject.ranges:
        return subject.ranges
    try:
        model = subject.source.build()
    except Exception:  # the DDP phase built it on the ranks; nothing more to learn here
        return code_ranges(None, subject.where)
    return code_ranges(model, subject.where)
