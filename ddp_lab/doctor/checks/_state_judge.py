"""The state check's judge (state.py hashes on the ranks): the first step at which a parameter
or a buffer differs between ranks, and the user's line: an edit made on some ranks only, a
change after the wrap (wrapped.py's record), a backward DDP did not reduce, hyperparameters that
part, a norm of unreduced gradients, an edit every rank makes outside the optimizer; the line
that wrote a buffer."""
from __future__ import annotations

from .api import MODEL_CHANGES as CHANGES, Finding  # what checks/wrapped.py records

NO_WRAPPER = "(no wrapper)"  # state.py's name for a parameter of a run with no wrapped model


def judge(ev) -> list[Finding]:
    rows = [{row["step"]: row for row in r.get("state", []) if not row.get("exit")} for r in ev.ranks]
    if len(rows) < 2 or not all(rows):
        return []
    _replicas_only(ev, rows)
    exits = _exits(ev)
    out = []
    for kind in ("parameter", "buffer"):
        hit, at_exit = _first_difference(rows, kind), False
        if not hit and exits:
            hit = _first_difference(exits, kind)
            at_exit = max(set.intersection(*(set(r) for r in rows))) if hit else False
        if hit:
            f = (_parameters if kind == "parameter" else _buffers)(ev, *hit)
            if at_exit is not False:
                f.title += f" (hashed when the script ended; equal after step {at_exit})"
            out.append(f)
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


def _exits(ev):
    """The rows each rank hashed when the script ended (the last step's state), keyed by that
    step, when every rank ended after the same step; else None."""
    ends = [[row for row in r.get("state", []) if row.get("exit")] for r in ev.ranks]
    if not all(ends) or len({e[-1]["step"] for e in ends}) != 1:
        return None
    _replicas_only(ev, [{e[-1]["step"]: e[-1]} for e in ends])
    return [{e[-1]["step"]: dict(e[-1], exit=True)} for e in ends]


def _replicas_only(ev, rows) -> None:
    """Parameters no wrapped model holds, in a run with none (a script that syncs its gradients
    by hand), are compared only where every rank started with the same values (state-start):
    ranks that each train their own model are not replicas."""
    starts = [{} for _ in ev.ranks]
    for r, rank in enumerate(ev.ranks):
        for rec in rank.get("state-start", []) or []:
            starts[r].update(rec["parameter"])
    equal = {n for n in starts[0] if all(n in s for s in starts) and len({s[n] for s in starts}) == 1}
    for r in rows:
        for row in r.values():
            row["parameter"] = {n: d for n, d in row["parameter"].items()
                                if not n.endswith(NO_WRAPPER) or n in equal}


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


def _edit_on_every_rank(ev, differ, step):
    """The user's line that edited these parameters outside the optimizer on every rank, first at
    or before `step`: what it writes is each rank's own unless it is computed from what every
    rank holds (e.g. codes reset from the rank's own batch). (line, entry) or None."""
    per_rank = [{e["line"]: e for e in r.get("state-edits", []) if e["kind"] == "parameter"}
                for r in ev.ranks]
    lines = [line for line in per_rank[0] if all(line in p for p in per_rank[1:])]
    hits = [per_rank[0][line] for line in lines
            if per_rank[0][line]["step"] <= step and set(per_rank[0][line]["names"]) & set(differ)]
    first = min(hits, key=lambda e: e["step"], default=None)
    return (first["line"], first) if first else None


_UNSYNCED_WHY = ("the last backward of step {step} ({line}) was not all-reduced: {why}; what it "
                 "added to the gradients is each rank's own")


def unsynced_row(ev, step) -> dict | None:
    """The first step, up to `step`, whose last backward DDP did not prepare for (any rank)."""
    rows = [row for r in ev.ranks for row in r.get("state-unsynced", []) or [] if row["step"] <= step]
    return min(rows, key=lambda row: row["step"]) if rows else None


def _unsynced(ev, step):
    """(where, fix) for parameters that part after a backward DDP did not all-reduce: the
    statement that set require_backward_grad_sync after the forward (when one does), else the
    backward's line; None when every step's last backward was DDP's."""
    row = unsynced_row(ev, step)
    if row is None:
        return None
    flag = row.get("flag") or []
    if len(flag) == 1:
        return flag[0], ("set model.require_backward_grad_sync before the forward: DDP reads it in "
                         "forward (distributed.py:1828), so a change after it acts on the next forward")
    return row["line"], ("end each optimizer step with a backward of a loss computed by DDP's forward "
                         "(one backward of the summed losses; not through ddp.module, nor a forward "
                         "inside no_sync with its backward outside)")


def _hyperparameters_part(ev) -> dict | None:
    """{step, line, what}: the first step at which an optimizer's hyperparameters differ between
    ranks, read from the optimizer check's records ("optimizer.hyper": each rank's values when
    they change, with who changed them), or None."""
    per = [{} for _ in ev.ranks]
    for r, rank in enumerate(ev.ranks):
        for rec in rank.get("optimizer.hyper", []) or []:
            per[r].setdefault(rec["o"], []).append(rec)
    found = []
    for o in set.intersection(*(set(p) for p in per)) if len(per) > 1 else ():
        recs = [sorted(p[o], key=lambda x: x["k"]) for p in per]
        for k in sorted({x["k"] for rs in recs for x in rs}):
            values = [[x for x in rs if x["k"] <= k][-1]["v"] for rs in recs]
            if any(v != values[0] for v in values[1:]):
                changed = [x for rs in recs for x in rs if x["k"] == k]
                by = [b["line"] for x in changed for b in x.get("by", []) if b.get("line")]
                stores = [c for x in changed for c in x.get("stores", [])]
                line = by[-1] if by else stores[0] if len(set(stores)) == 1 else ""
                found.append({"step": changed[0]["s"], "line": line,
                              "what": f"optimizer {o}'s step {k}"})
                break
    return min(found, key=lambda f: f["step"]) if found else None


def _local_norm(ev, step) -> dict | None:
    """The first norm of the optimizers' gradients, at a step up to `step`, that read different
    gradients on different ranks (state-grad-reads: the same line, the n-th of its step)."""
    seen: dict = {}
    for r, rank in enumerate(ev.ranks):
        count: dict = {}
        for rec in rank.get("state-grad-reads", []) or []:
            if rec["step"] <= step:
                key = (rec["step"], rec["line"], count.setdefault((rec["step"], rec["line"]), 0))
                count[(rec["step"], rec["line"])] += 1
                seen.setdefault(key, {})[r] = rec["digest"]
    parted = [k for k, d in seen.items() if len(d) == len(ev.ranks) and len(set(d.values())) > 1]
    if not parted:
        return None
    step_, line, _ = min(parted)
    return {"step": step_, "line": line}


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
    elif (unsynced := _unsynced(ev, step)) is not None:
        where, fix = unsynced
        ev_lines.append(_UNSYNCED_WHY.format(**unsynced_row(ev, step)))
    elif (parting := _hyperparameters_part(ev)) is not None and parting["step"] <= step:
        where = parting["line"]
        ev_lines.append(f"the optimizers' hyperparameters part first, at step {parting['step']} "
                        f"({parting['what']})"
                        + (f", changed at {where}" if where else ""))
        fix = "change the optimizer's hyperparameters the same way on every rank"
    elif (read := _local_norm(ev, step)) is not None:
        where = read["line"]
        ev_lines.append(f"the gradients' norm taken at {where} (step {read['step']}) read each rank's own "
                        "gradients (they differed between ranks there): a per-rank value, and the ranks' "
                        "updates differ after it")
        fix = ("take the norm from the synchronised gradients (after their all_reduce), or clip with "
               "clip_grad_norm_ after it: every rank must scale its gradients by the same factor")
    elif (alike := _edit_on_every_rank(ev, differ, step)) is not None:
        where, e = alike
        ev_lines.append(f"every rank writes {', '.join(e['names'][:4])} outside the optimizer at "
                        f"{where} (from step {e['step']}), and they differ after it: unless what "
                        "that line writes is the same on every rank, nothing makes them agree again")
        fix = ("compute what that line writes from values every rank holds (all_reduce or "
               "broadcast them first), or broadcast the parameter from one rank after the write")
    if any(n.endswith("(in no wrapped model)") for n in differ):
        built = {n: line for r in ev.ranks[:1] for rec in r.get("state-built", []) for n, line in rec.items()}
        made = next((built[n] for n in differ if n in built), "")
        where = where or made
        if made:
            ev_lines.append(f"the module holding them was built at {made} and never wrapped")
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
