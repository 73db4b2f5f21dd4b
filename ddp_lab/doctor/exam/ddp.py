"""The doctor's DDP phase: one launch of `world_size` real ranks running dynamic.probe (the dry
run, then DDP and the training steps), its records read into findings (analyze, randomness,
mechanisms, measure), and the run's own outcome (failures)."""
from __future__ import annotations

from ...launching.launcher import launch
from ..report import BY_TITLE, Finding, dedupe
from ..sync import records
from .analyze import dry_findings
from .dynamic import probe
from .failures import failure_findings
from .measure import measure_findings, step_collective_findings
from .mechanisms import mechanism_findings

GRACE = 2.0  # seconds the other ranks get after one fails before their stacks are taken
STRUCTURAL = ("model-differs-between-ranks", "requires-grad-differs-between-ranks")


def phase(subject):
    """(RunResult, findings) of the DDP phase."""
    # INFO, not DETAIL: on this build a process group created under DETAIL crashes DDP (a bug
    # of torch 2.13's wrapped group); INFO already makes DDP name the parameters without grad.
    run = launch(probe, subject, world_size=subject.world_size, timeout=subject.timeout,
                 grace=GRACE, env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, label="doctor")
    recs = [records(r.stdout) for r in run.ranks]
    unused = set().union(*[set((r.get("dry") or {}).get("unused", [])) for r in recs])
    mechanisms, explained = mechanism_findings(recs, subject.steps)
    findings = dry_findings(recs, subject.amp, subject.ddp_kwargs) + mechanisms
    findings = _merge_failure(findings, failure_findings(run, recs, subject.amp, subject.where))
    if recs and recs[0]:
        findings += (measure_findings(recs[0], subject.steps, unused, explained)
                     + step_collective_findings(recs))
    return run, dedupe(findings, BY_TITLE)


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
