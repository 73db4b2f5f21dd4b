"""The state check's judge (state.py hashes on the ranks): the first step at which a parameter
or a buffer differs between ranks, and the user's line: an edit made on some ranks only, a
change after the wrap (wrapped.py's record), the line that wrote a buffer."""
from __future__ import annotations

from .api import MODEL_CHANGES as CHANGES, Finding  # what checks/wrapped.py records


def judge(ev) -> list[Finding]:
    rows = [{row["step"]: row for row in r.get("state", [])} for r in ev.ranks]
    if len(rows) < 2 or not all(rows):
        return []
    out = []
    for kind in ("parameter", "buffer"):
        hit = _first_difference(rows, kind)
        if hit:
            out.append((_parameters if kind == "parameter" else _buffers)(ev, *hit))
    if not out and all(not r[s]["parameter"] and not r[s]["buffer"] for r in rows for s in r) \
            and any(r[s]["sharded"] for r in rows for s in r):
        out.append(Finding(
            "info", "state-not-compared", "12",
            "parameters not compared across ranks: every one is sharded (FSDP2)",
            [f"{max(r[s]['sharded'] for r in rows for s in r)} sharded DTensor parameter(s): "
             "each rank holds its own shard by design, and the model has no buffers"],
            strategies=("fsdp2",)))
    return out


def _first_difference(rows, kind):
    for step in sorted(set.intersection(*(set(r) for r in rows))):
        states = [r[step][kind] for r in rows]
        differ = [n for n in states[0] if all(n in s for s in states) and len({s[n] for s in states}) > 1]
        if differ:
            return step, differ, states
    return None


def _hashes(name, states) -> str:
    return f"{name}: " + ", ".join(f"rank {r} {s[name]}" for r, s in enumerate(states))


def _uneven_edit(ev, kind, differ, step):
    """The user's line that edited these tensors outside the optimizer on some ranks only (or a
    different number of times): (line, entry, ranks that ran it), or None."""
    per_rank = [{e["line"]: e for e in r.get("state-edits", []) if e["kind"] == kind} for r in ev.ranks]
    best = None
    for line in dict.fromkeys(line for p in per_rank for line in p):
        counts = [p[line]["count"] if line in p else 0 for p in per_rank]
        e = next(p[line] for p in per_rank if line in p)
        if len(set(counts)) == 1 or e["step"] > step:
            continue
        score = (bool(set(e["names"]) & set(differ)), -e["step"])
        if best is None or score > best[0]:
            best = (score, line, e, [r for r, c in enumerate(counts) if c])
    return best[1:] if best else None


def _change(ev, step):
    for r in ev.ranks:
        for c in r.get(CHANGES, []):
            if c.get("step", 0) <= step:
                return c
    return None


def _parameters(ev, step, differ, states) -> Finding:
    ev_lines = [_hashes(differ[0], states)] + ([f"also: {', '.join(differ[1:6])}"] if len(differ) > 1 else [])
    where, fix = "", ("change parameters only through the optimizer's step on all-reduced gradients, "
                      "or identically on every rank")
    edit = _uneven_edit(ev, "parameter", differ, step)
    change = None if edit else _change(ev, step)
    if edit:
        where, e, ranks = edit
        ev_lines.append(f"rank(s) {', '.join(map(str, ranks))} of {ev.world_size} edited "
                        f"{', '.join(e['names'][:4])} outside the optimizer (step {e['step']}): {where}")
        fix = ("make the edit on every rank, or before DDP(...) (its constructor broadcasts rank 0's "
               "parameters; nothing does afterwards)")
    elif change:
        where = change["line"]
        ev_lines.append(f"{change['what']} after the model was wrapped ({change.get('wrapped_at', '')}): "
                        f"{where}")
        fix = "make the change before wrapping the model, or wrap it again afterwards"
    if any(n.endswith("(in no wrapped model)") for n in differ):
        ev_lines.append("the optimizer steps parameters that no DDP(...) or fully_shard'ed module holds: "
                        "nothing reduces their gradients")
        fix = "wrap the whole model (fully_shard the root too, or DDP around every trained module)"
    ev_lines.append("the ranks now train different models; a checkpoint saved by rank 0 holds rank 0's only")
    return Finding("error", "parameters-differ-after-step", "01",
                   f"{len(differ)} parameter(s) differ between ranks after step {step}",
                   ev_lines, fix=fix, where=where)


def _buffers(ev, step, differ, states) -> Finding:
    ev_lines = [_hashes(differ[0], states)] + ([f"also: {', '.join(differ[1:6])}"] if len(differ) > 1 else [])
    writes = [e for r in ev.ranks[:1] for e in r.get("state-edits", [])
              if e["kind"] == "buffer" and set(e["names"]) & set(differ)]
    unsynced = [m for m in ev.ranks[0].get("state-models", []) if m["kind"] == "ddp" and not m["sync_buffers"]]
    where = writes[0]["line"] if writes else ""
    if writes:
        ev_lines.append(f"written on each rank from its own data at {where}")
    if unsynced:
        where = unsynced[0]["line"] or where
        ev_lines.append("DDP does not broadcast buffers before each forward here (broadcast_buffers=False)")
    elif any(m["kind"] == "fsdp2" for m in ev.ranks[0].get("state-models", [])):
        ev_lines.append("fully_shard never syncs buffers: each rank keeps its own")
    ev_lines.append("each rank's statistics come from its own batches; evaluation and the "
                    "checkpoint rank 0 saves use rank 0's")
    return Finding("warning", "buffers-differ-after-step", "08",
                   f"{len(differ)} buffer(s) differ between ranks after step {step}", ev_lines,
                   fix="all_reduce the statistic before writing it into the buffer (SyncBatchNorm on "
                       "GPUs), keep DDP's buffer broadcast on, or recompute it identically on every rank",
                   where=where)
