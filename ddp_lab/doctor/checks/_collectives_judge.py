"""The collectives check's judge (collectives.py records on the ranks): where the ranks' calls
part (the flight recorder, the check's own record), what each rank was doing at the end, and the
user's line at fault; a hang with no collective to tell the ranks apart."""
from __future__ import annotations

import os
import re

from ...launching import divergence
from ...launching.results import peer_gone
from ..frames import script_frames
from ..userline import describe
from ._collectives_loop import inside_loop, loop_exit
from .api import KEEP, TIMED_OUT, Finding

KEY = "collective-calls"




def _position(ev, r: int, folder: str):
    """(what rank r was doing at the end, its user frames innermost first)."""
    rec = ev.ranks[r] if r < len(ev.ranks) else {}
    run_rank = ev.run.ranks[r] if ev.run is not None and r < len(ev.run.ranks) else None
    if run_rank is not None and run_rank.status == "timeout":
        return "hung", script_frames(run_rank.stack, folder, True)
    if rec.get("hung"):
        return "hung", script_frames(rec["hung"].get("stack", ""), folder, False)
    if rec.get("error"):
        err = rec["error"]
        why = (" (its peer was gone)" if peer_gone(err.get("message", "")) else
               " (a collective timed out)" if TIMED_OUT.search(err.get("message", "")) else "")
        return f"raised {err.get('type', 'an exception')}{why}", script_frames(
            err.get("traceback", ""), folder, False)
    return ("returned", []) if rec.get("exit") == 0 else ("unknown", [])


def _hook_parting(calls: dict):
    """(index, {rank: entry or None}) where the ranks' recorded calls first differ, or None."""
    if len(calls) < 2:
        return None
    full = any(len(c) >= KEEP for c in calls.values())  # ctx keeps KEEP a key: no further
    for i in range(max(len(c) for c in calls.values())):
        at = {r: (c[i] if i < len(c) else None) for r, c in calls.items()}
        if any(e is None for e in at.values()):
            return None if full else (i, at)
        if len({(e["op"], repr(e["shape"])) for e in at.values()}) > 1:
            return i, at
    return None


def _flight_parting(ev):
    if ev.run is None:
        return None

    parted = divergence.find(ev.run.ranks)
    if parted is None:
        return None
    entered = [c for c in parted.entries.values() if c is not None]
    if (parted.kind == "size" and len(entered) == len(parted.entries)
            and len({(c.op, c.sizes, c.dtypes) for c in entered}) == 1):
        return None  # torch's analyser on all_gathers every rank gave alike (FSDP2's full_tensor in a save, torch 2.13, gloo)
    return parted


def _own_errors(ev) -> set:
    """Ranks whose script raised on its own (not a lost peer, not a collective's timeout)."""
    return {r for r, rec in enumerate(ev.ranks) if isinstance(rec.get("error"), dict)
            and not peer_gone(rec["error"].get("message", ""))
            and not TIMED_OUT.search(rec["error"].get("message", ""))}


def _only_raised(entries: dict, ev) -> bool:
    """The ranks part only because some raised on their own and stopped calling (the raised
    check's finding), not because they called something else."""
    silent = {r for r, e in entries.items() if e is None}
    return bool(silent) and silent <= _own_errors(ev)


def _hung(ev) -> bool:
    if _own_errors(ev):
        return False  # the launcher stopped the others after a rank raised: not a hang
    if ev.run is not None and ev.run.status == "timeout":
        return True
    return any(r.get("hung") or TIMED_OUT.search((r.get("error") or {}).get("message", ""))
               for r in ev.ranks)


def _failed(ev) -> bool:
    return _hung(ev) or any(r.get("error") or r.get("exit") for r in ev.ranks) or (
        ev.run is not None and not ev.run.ok)


def _said(ev, r: int, entry, state: str, frames: list) -> str:
    if entry is not None:
        shape = "" if entry["shape"] is None else entry["shape"]
        return (f"rank {r} entered {entry['op']}({shape}) in step {entry['step']}"
                f" at {entry['line'] or 'a line outside your script'}")
    steps = len(ev.steps(r))
    if state == "returned":
        return f"rank {r} returned from the script after {steps - 1} step(s)"
    if state == "unknown":
        return f"rank {r} left no record of where it stood"
    at = f" at {describe(*frames[0])}" if frames else ""
    return f"rank {r} {state} in step {max(steps - 1, 0)}{at}"


def judge(ev):
    folder = os.path.dirname(os.path.abspath(ev.script))
    calls = {r: rec.get(KEY, []) for r, rec in enumerate(ev.ranks)
             if not rec.get("lost")}  # lost: a rank that never handed its records over
    flight = _flight_parting(ev)
    hook = _hook_parting(calls)
    if hook is not None and flight is None and not _failed(ev):
        hook = None  # DDP's C++ collectives are not in the hook's record: it alone is no proof
    if hook is not None and _only_raised(hook[1], ev):
        hook = None
    if flight is not None and _only_raised(flight.entries, ev):
        flight = None
    positions = {r: _position(ev, r, folder) for r in range(len(ev.ranks))}
    entries = hook[1] if hook else {r: None for r in positions}
    parted = flight or hook or (_failed(ev) and not _own_errors(ev))
    left = _left_loop(ev, entries, positions) if parted else None
    if flight is None and hook is None and left is None:  # under torchrun: no flight recorder
        return [_hang(ev, positions)] if _hung(ev) else []
    where, cause, fix = left or _attribute(entries, positions, calls)
    ev_lines = [_said(ev, r, entries.get(r), *positions[r]) for r in sorted(positions)]
    if flight is not None:
        ev_lines.append(divergence.describe(ev.run.ranks))
        ev_lines.append(_flight_steps(ev, flight))
    ev_lines = [e for e in ev_lines if e] + ([cause] if cause else [])
    trace = ""
    if ev.run is not None:
        trace = divergence.table(ev.run.ranks)
    return [Finding("error", "collectives-differ-between-ranks", "13",
                    "the ranks entered different collectives" + (" and hung" if _hung(ev) else ""),
                    ev_lines, fix=fix, trace=trace, where=where)]


def _flight_steps(ev, parted) -> str:
    """The step each rank was in when it entered the flight recorder's collective #N (or its
    last one), by the time the recorder gave it: the step that never ended included."""
    said = []
    for r, c in sorted(parted.entries.items()):
        c = c or parted.last.get(r)
        step = ev.step_at(r, c.created) if c is not None and c.created else None
        if c is not None and step is not None:
            said.append(f"rank {r} entered {c.op} #{c.seq} in step {step}")
    return "by step: " + "; ".join(said) if said else ""


def _left_loop(ev, entries: dict, positions: dict):
    """(where, evidence, fix) when a rank had left the loop that steps the optimizer while
    another was still in it (its call or its last position inside the loop), else None."""
    step_at = next((r["step-line"] for r in ev.ranks if r.get("step-line")), None)
    if not step_at:
        return None
    stacks = {r: ([tuple(s.rsplit(":", 1)) for s in e["stack"]] if e is not None else
                  positions[r][1]) for r, e in entries.items()}
    left = [r for r in stacks if not inside_loop(step_at, stacks[r])
            and (entries.get(r) is not None or positions[r][0] == "returned")]
    stayed = [r for r in stacks if r not in left and inside_loop(step_at, stacks[r])]
    exit_line, how = loop_exit(step_at) if left and stayed else (0, "")
    if not exit_line:
        return None
    cause = (f"rank {', '.join(map(str, left))} left the training loop while rank "
             f"{', '.join(map(str, stayed))} went on into another step: {how}")
    fix = ("every rank must run the same number of steps: " +
           ("decide the stop with a value all ranks agree on (all_reduce the flag, then break "
            "on the result)" if "break" in how else
            "give every rank the same number of batches (DistributedSampler pads them; or "
            "drop_last, or DDP's join() context for uneven inputs)"))
    return describe(step_at[0], exit_line), cause, fix


def _attribute(entries: dict, positions: dict, calls: dict):
    """(where, a sentence of evidence, the fix) from the calls where the ranks part."""
    lines = {r: {c["line"] for c in made} for r, made in calls.items()}
    # A rank with no call at all where another made its first may never have got that far (a
    # rank still starting): its silence names no line.
    silent = any(e is None and r in calls and not calls[r] and positions[r][0] != "returned"
                 for r, e in entries.items())
    for r, e in ({} if silent else entries).items():
        if e is not None and e["line"] and not any(e["line"] in lines[o] for o in lines if o != r):
            return (e["line"], f"only rank {r} called a collective from this line",
                    "a collective needs every rank of the group: call it on every rank or on "
                    "none (move it out of the rank-only branch; run rank 0's own work, such as "
                    "validation, on the plain module: model.module)")
    named = [e for e in entries.values() if e is not None and e["line"] and not silent]
    if named:
        return (named[0]["line"], "the ranks reached this line with different collectives",
                "every rank must issue the same collectives in the same order with the same "
                "shapes: iterate in an order all ranks share (sorted keys), never a rank's own")
    hung = [f for state, f in positions.values() if f]
    return (describe(*hung[0][0]) if hung else ""), "", (
        "every rank must call the same collectives in the same order")


def _hang(ev, positions: dict) -> Finding:
    said = [_said(ev, r, None, *positions[r]) for r in sorted(positions)]
    where = next((describe(*f[0]) for state, f in positions.values() if state == "hung" and f), "")
    where = where or next((describe(*f[0]) for _, f in positions.values() if f), "")
    stopped = next((ev.run.ranks[r].stack_summary() for r in positions
                    if ev.run is not None and ev.run.ranks[r].status == "timeout"), "")
    return Finding("error", "hang", "13", "the ranks hung: no collective tells them apart",
                   said, fix="a rank waits for something its peers never do: read where each "
                   "rank stood (above); a collective on one rank only, or a wait on a file, a "
                   "queue or a lock another rank never releases", trace=stopped, where=where)
