"""Findings from a doctor run that did not end well: an exception (root-cause rank first), a
hang (each rank's stack), a crash. The evidence is the ranks' own: PyTorch's message, the
phase each rank had reached, where in the user's code each one stopped."""
from __future__ import annotations

from ...launching.divergence import table
from ...launching.sanitize import sanitize
from ..errors import DoctorBug
from ..frames import DOCTOR, ours, tidy, user_frame_in
from ..report import Finding, brief
from .classify import classify

PHASES = {
    "build": "while building the module", "dry-run": "in the first forward/backward (no DDP yet)",
    "compare": "comparing the first forward/backward with the other ranks",
    "unused": "in two steps under a plain DDP", "ddp": "while wrapping the module in DDP",
    "steps": "in the DDP training steps", "done": "after the checks",
}
TRACE_CHARS = 6000


def phase_of(rec: dict) -> str:
    phase = rec.get("phase", "")
    where = PHASES.get(phase, "before the doctor's first check")
    if phase == "steps" and "step" in rec:
        where += f" (step {rec['step'] + 1})"
    return where


def failure_findings(result, recs: list[dict], amp: str | None,
                     where: dict | None = None) -> list[Finding]:
    """`where`: frames.code_map of the user's module, to name code shipped by value."""
    if result.ok:
        return []
    if result.status == "error" or result.root_cause.status == "error":
        found = _exception(result, recs, amp)
    elif result.status == "timeout" and not any(r.status in ("error", "crashed")
                                                for r in result.ranks):
        found = _hang(result, recs, where)
    else:
        found = _crash(result, recs)
    found.trace = tidy(found.trace, where)
    return [found]


def _raise_if_doctor_bug(rank) -> None:
    frames = [(f, fn) for f, _, fn in ours.FRAME.findall(rank.error.traceback)]
    while frames and frames[-1][1] == "__torch_function__":  # passes torch's own errors on
        frames.pop()
    if (frames and ours.in_places(frames[-1][0], (DOCTOR,))
            and rank.error.type != "DoctorInputError"):
        raise DoctorBug(f"ddp-lab doctor failed on rank {rank.rank} (a bug in the doctor, not in "
                        f"your module):\n{sanitize(rank.error.traceback)}")


def _exception(result, recs, amp) -> Finding:
    root = result.root_cause
    _raise_if_doctor_bug(root)
    message = sanitize(root.error.message)
    lesson, code, fix = classify(root.error.type + ": " + message, amp)
    ev = [f"rank {root.rank} raised {root.error.type} {phase_of(recs[root.rank])}: "
          f"{brief(root.error.first_line)}"]
    if _names_line(message):
        ev.append(_names_line(message))
    ev += [f"then rank {r.rank}: " + ("the same error" if r.headline == root.headline
                                      else brief(r.headline)) for r in result.failures[1:]]
    return Finding("error", code, lesson, f"rank {root.rank} raised {root.error.type}",
                   [sanitize(e) for e in ev], fix,
                   trace=sanitize(root.error.traceback)[-TRACE_CHARS:])


def _names_line(message: str) -> str:
    for line in message.splitlines():
        if "did not receive grad" in line and "Parameters" in line:
            return line.strip()
    return ""


def _still_starting(result, recs) -> bool:
    """No rank reached the module, or every stopped rank was importing a module."""
    stopped = [r for r in result.ranks if r.status == "timeout"]
    return not any(rec.get("phase") for rec in recs) or all(
        "importlib._bootstrap" in _main_thread(r.stack) for r in stopped)


def _hang(result, recs, where: dict | None = None) -> Finding:
    if _still_starting(result, recs):
        return Finding(
            "error", "ranks-too-slow-to-start", "06",
            f"the ranks were still starting up when the timeout ({result.timeout:g} s) struck",
            [f"rank {r.rank} {phase_of(recs[r.rank])}: {r.headline}" for r in result.ranks]
            + ["they were importing torch's modules, not running yours: this says nothing about "
               "the module"],
            "give a larger timeout: the first launch of a Python process starts the fork server "
            "and imports torch, which takes several seconds on a busy machine",
            trace=_main_thread(result.ranks[0].stack_summary())[-TRACE_CHARS:])
    ev = []
    for r in result.ranks:
        if r.status == "timeout":
            mine = user_frame_in(r.stack, where)
            at = ", ".join(x for x in (r.stuck_in(), f"called from {mine}" if mine else "") if x)
            ev.append(f"rank {r.rank} stuck {phase_of(recs[r.rank])}: {at or 'see its stack'}"
                      + _forward_calls(recs[r.rank]))
        else:
            ev.append(f"rank {r.rank}: {r.status} ({phase_of(recs[r.rank])})")
    traces = "\n\n".join(f"--- stack of rank {r.rank} ---\n{_main_thread(r.stack_summary())}"
                         for r in result.ranks if r.stack)
    if parted := result.divergence():  # the flight recorder's table, as in the launcher's report

        ev.append(parted)
        traces = f"--- flight recorder ---\n{table(result.ranks)}\n\n{traces}"
    return Finding(
        "error", "hang", "03", f"the ranks hung (stopped after {result.timeout:g} s)",
        ev + ["a collective some ranks call and others do not (or call in another order) waits "
              "for ever"],
        "call every collective on every rank in the same order; dist.monitored_barrier (gloo) "
        "names the rank that does not arrive",
        trace=traces[-TRACE_CHARS:])


def _forward_calls(rec: dict) -> str:
    dry = rec.get("dry")
    if not dry or rec.get("phase") == "dry-run":
        return ""
    calls = dry.get("collectives", [])
    return f" (its forward called {len(calls)} collective(s){': ' if calls else ''}{', '.join(calls[:3])})"


def _main_thread(stack: str) -> str:
    """The main thread's block of a faulthandler dump (the one that runs the module)."""
    blocks = stack.split("\n\n")
    main = [b for b in blocks if "most recent call first" in b and "in probe" in b]
    return (main[0] if main else stack).strip()


def _crash(result, recs) -> Finding:
    root = result.root_cause
    lines = [ln for ln in sanitize(root.stderr).strip().splitlines()
             if not ln.startswith("Extension modules:")]
    tail = "\n".join(lines[-15:])
    ev = [f"rank {root.rank} {root.headline} {phase_of(recs[root.rank])}"]
    ev += [f"then rank {r.rank}: {brief(r.headline)}" for r in result.failures[1:]]
    lesson, code, fix = classify(tail)
    return Finding("error", "crash" if code == "exception" else code, lesson,
                   f"rank {root.rank} crashed", ev, fix, trace=tail)
