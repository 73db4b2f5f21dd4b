"""The script raised on some rank: PyTorch's message, the root-cause rank (the first to fail on
its own) and the user's innermost line of its traceback.

The core records, per rank, the exception the script raised ("error": type, message, traceback,
the user's innermost line, the step, the time). A rank whose error only says that a peer went
away (gloo's "Connection closed by peer" and the like: ddp_lab.launching.results.peer_gone) failed
because another did; a rank the launcher stopped never raised; a collective that timed out
(gloo's "Timed out waiting Nms", the script's own process-group timeout) is a hang, which the
collectives check reports with its step and line. The root cause is the first of
the others by time (failures within 0.1 s of each other are a tie, broken by rank, as the
launcher's own RunResult.failures orders them). When every error is such a consequence, the
collectives check says what happened (a rank returned or hung while its peers waited).
"""
from __future__ import annotations

import os

from ...launching.results import SIMULTANEOUS, peer_gone
from ...launching.sanitize import sanitize
from .api import TIMED_OUT, Check, Finding, brief


def _errors(ev) -> dict:
    return {r: rec["error"] for r, rec in enumerate(ev.ranks)
            if isinstance(rec.get("error"), dict) and rec["error"].get("type")}


def root_cause(ev):
    """(rank, error record) of the first rank that failed on its own, or None."""
    own = {r: e for r, e in _errors(ev).items()
           if not peer_gone(e.get("message", "")) and not TIMED_OUT.search(e.get("message", ""))}
    if not own:
        return None
    first = min(e.get("at") or float("inf") for e in own.values())

    def when(item):
        r, e = item
        t = e.get("at") or float("inf")
        return (0.0 if t - first < SIMULTANEOUS else t, r)
    return min(own.items(), key=when)


def judge(ev):
    found = root_cause(ev)
    if found is None:
        return []
    rank, err = found
    message = sanitize(f"{err['type']}: {err.get('message', '')}".strip())
    first = next((ln for ln in message.splitlines() if ln.strip()), message)
    others = sorted(set(_errors(ev)) - {rank})
    evidence = [brief(first)]
    if others:
        evidence.append(f"then rank{'s' if len(others) > 1 else ''} "
                        f"{', '.join(map(str, others))} failed too: consequences of rank {rank}'s")
    step = err.get("step")
    return [Finding(
        "error", "script-raised", "06",
        f"rank {rank} raised {err['type']}" + (f" in step {step}" if step is not None else ""),
        evidence,
        fix="read the root-cause rank's traceback (below) from its last line of your code: the "
            "other ranks' errors follow from it",
        trace=_without_folder(err.get("traceback", ""), ev.script)[-4000:],
        where=err.get("line", ""))]


def _without_folder(text: str, script: str) -> str:
    """The traceback, sanitized, with the script's folder left out of its paths ("train.py")."""
    folder = os.path.dirname(os.path.abspath(script)) + os.sep if script else ""
    return sanitize(text.replace(folder, "") if folder != os.sep else text)


CHECK = Check(
    name="raised",
    mechanism="the script raised on some rank: PyTorch's message, the root-cause rank, the line",
    lesson="06",
    codes={"script-raised": "error"},
    judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_raised.py",
    notes=("an error that only says a peer went away is a consequence, never the root cause",))
