"""The optimizer check's judge (optimizer.py says what it judges; _optimizer_rank.py records):
the first step at which an optimizer's hyperparameters differ between ranks and the line that
changed them; an optimizer none of whose parameters ever had a gradient; a step whose gradients
still held the last step's."""
from __future__ import annotations

from .api import Finding

REL = 1e-9  # ranks computing one schedule get the same floats; this only forgives a last bit


def judge(ev) -> list[Finding]:
    return _hyperparameters(ev) + _idle(ev) + _stale(ev)


# --- hyperparameters --------------------------------------------------------------------------

def _by_optimizer(rank: dict, key: str) -> dict:
    out: dict = {}
    for rec in rank.get(key, []) or []:
        out.setdefault(rec["o"], []).append(rec)
    return {o: sorted(recs, key=lambda r: r.get("k", 0)) for o, recs in out.items()}


def _summaries(ev) -> list[dict]:
    return [{s["o"]: s for s in r.get("optimizer.summary", []) or []} for r in ev.ranks]


def _hyperparameters(ev) -> list[Finding]:
    out = []
    for o, k, diff, recs, late in _partings(ev):
        out.append(_parted_late(ev, o, late, recs) if late else _parted(ev, o, k, diff, recs))
    return out


def _partings(ev):
    """(optimizer, its step, (group, key, values per rank), its records per rank, None) where
    the hyperparameters of an optimizer shared across the ranks first differ; the last item is
    each rank's summary instead when they part past the records kept."""
    if len(ev.ranks) < 2:
        return
    per = [_by_optimizer(r, "optimizer.hyper") for r in ev.ranks]
    summaries = _summaries(ev)
    for o in sorted(set.intersection(*(set(p) for p in per))):
        recs = [p[o] for p in per]
        if not all(rs[0]["k"] == 0 for rs in recs) or not _shared([rs[0].get("shared", {}) for rs in recs]):
            continue
        known = [s[o]["k"] for s in summaries if o in s]
        last = min(known) if known else max(rec["k"] for rs in recs for rec in rs) + 1
        for k in sorted({rec["k"] for rs in recs for rec in rs if rec["k"] < last}):
            diff = _difference([_at(rs, k) for rs in recs])
            if diff:
                yield o, k, diff, recs, None
                break
        else:
            finals = [s.get(o) for s in summaries]
            cut = any(f and f["changes"] > len(rs) for f, rs in zip(finals, recs))
            if cut and all(finals) and len({f["chain"] for f in finals}) > 1:
                yield o, None, None, recs, finals


def _step_of(k, recs) -> int:
    """The run's step at which an optimizer took its step k (from a rank that recorded it)."""
    return next(rec["s"] for rs in recs for rec in rs if rec["k"] == k)


def _shared(firsts: list[dict]) -> bool:
    """One model across the ranks: wrapped, DTensors, or equal at the first step (replicas)."""
    if any(f.get("wrapped") or f.get("dtensor") for f in firsts):
        return True
    samples = [f.get("sample") for f in firsts]
    return None not in samples and len(set(samples)) == 1


def _at(recs: list[dict], k: int):
    found = recs[0]
    for rec in recs:
        if rec["k"] <= k:
            found = rec
    return found["v"]


def _close(a, b) -> bool:
    return a == b or (a is not None and b is not None and abs(a - b) <= REL * max(abs(a), abs(b)))


def _difference(values):
    """(group, key, [value per rank]) of the first hyperparameter that differs, or None."""
    if len({len(v) for v in values}) > 1:
        return None, "param groups", [len(v) for v in values]
    for g in range(len(values[0])):
        rows = [dict(map(tuple, v[g])) for v in values]
        for key in dict.fromkeys(k for row in rows for k in row):
            got = [row.get(key) for row in rows]
            if not all(_close(got[0], x) for x in got[1:]):
                return g, key, got
    return None


def _parted(ev, o, k, diff, recs) -> Finding:
    group, key, got = diff
    at = [next((rec for rec in rs if rec["k"] == k), None) for rs in recs]
    step = _step_of(k, recs)
    changed = [r for r, rec in enumerate(at) if rec is not None]
    what = f"group {group} {key}" if group is not None else key
    lines = [f"{what}: " + ", ".join(f"rank {r} {_num(v)}" for r, v in enumerate(got))
             + f" at step {step} (this optimizer's step {k})"]
    where, candidates = "", []
    for r in changed:
        by = [b for b in at[r].get("by", []) if b.get("line")]
        if by:
            lines.append(f"rank {r}: {'built' if by[-1]['what'] == 'built' else 'changed'} by "
                         f"{by[-1]['what']} at {by[-1]['line']}")
            where = where or by[-1]["line"]
        candidates += [c for c in at[r].get("stores", []) if c not in candidates]
    if k and len(changed) < len(recs):
        kept = [r for r in range(len(recs)) if r not in changed]
        lines.append(f"rank(s) {', '.join(map(str, kept))} did not change it before this step")
    if not where and candidates:
        if len(candidates) == 1:
            where = candidates[0]
            lines.append(f"changed between this optimizer's steps {k - 1} and {k} on rank(s) "
                         f"{', '.join(map(str, changed))}, by the one statement that stores it: {where}")
        else:
            lines.append("changed between two steps by one of the statements that store it: "
                         + "; ".join(candidates))
    lines.append("the ranks now apply different updates to one model: its replicas (or shards) part")
    return Finding("error", "optimizer-hyperparameters-differ", "19",
                   f"the optimizer's {key} differs between ranks from step {step}", lines,
                   fix="change hyperparameters the same way on every rank: step the scheduler on every "
                       "rank with a value every rank holds (all_reduce it; dist.reduce leaves the result "
                       "on dst only), never under `if rank == 0:`",
                   where=where)


def _parted_late(ev, o, finals, recs) -> Finding:
    last = min(rs[-1]["k"] for rs in recs)
    lines = [f"the hyperparameters each rank ended with: " + "; ".join(
        f"rank {r} {_brief(f['v'])}" for r, f in enumerate(finals)),
        f"they agreed through this optimizer's step {last}, the last whose changes were kept"]
    return Finding("error", "optimizer-hyperparameters-differ", "19",
                   "the optimizer's hyperparameters differ between ranks by the end of the run", lines,
                   fix="change hyperparameters the same way on every rank", where="")


def _num(v) -> str:
    return "missing" if v is None else f"{v:.6g}"


def _brief(groups) -> str:
    return ", ".join(f"{k} {_num(v)}" for g in groups[:1] for k, v in g if k in ("lr", "weight_decay", "momentum"))


# --- an optimizer whose parameters never had a gradient -----------------------------------------

def _idle(ev) -> list[Finding]:
    summaries, out, said = _summaries(ev), [], set()
    for r, rank in enumerate(ev.ranks):
        for rec in rank.get("optimizer.idle", []) or []:
            s = summaries[r].get(rec["o"])
            if rec["o"] in said or (s is not None and s["live"]):
                continue  # it had gradients at another of its steps
            said.add(rec["o"])
            ranks = [q for q, sm in enumerate(summaries) if rec["o"] in sm and not sm[rec["o"]]["live"]]
            steps = s["k"] if s else None
            lines = [f"built at {rec['line']}; stepped {steps if steps is not None else 'at least 2'} "
                     f"times (at {rec['at']}), on rank(s) {', '.join(map(str, ranks or [r]))}",
                     f"none of its {rec['params']} parameter(s) ever had a gradient, though they require one: "
                     "the loss never reaches them, so no step changes them"]
            if rec.get("elsewhere"):
                lines.append("the script's model holds other parameters, which do get gradients and that no "
                             "step of this optimizer updates: " + ", ".join(rec["elsewhere"]))
            out.append(Finding(
                "error", "optimizer-steps-without-gradients", "01",
                "an optimizer steps parameters that never receive a gradient: it trains nothing", lines,
                fix="build the optimizer from the parameters of the model in its final form: after "
                    "parallelize_module, fully_shard or loading replaced them, from the model the loss uses",
                where=rec["line"]))
    return out


# --- gradients that still hold the last step's ---------------------------------------------------

def _stale(ev) -> list[Finding]:
    first: dict = {}
    for r, rank in enumerate(ev.ranks):
        for rec in rank.get("optimizer.stale", []) or []:
            first.setdefault(rec["o"], []).append((r, rec))
    out = []
    for o, hits in sorted(first.items()):
        r, rec = min(hits, key=lambda h: (h[1]["s"], h[0]))
        lines = [f"at step {rec['s']} the gradients of the optimizer built at {rec['built']} still held "
                 f"the last step's: nothing zeroed them or set them to None between its steps "
                 f"(rank(s) {', '.join(str(q) for q, _ in hits)})",
                 "each step applies the running sum of every earlier gradient; deliberate accumulation "
                 "is several backwards, then one step, then zero_grad"]
        out.append(Finding("warning", "gradients-accumulate-across-steps", "10",
                           "gradients accumulate across optimizer steps: nothing zeroes them", lines,
                           fix="call optimizer.zero_grad() once per optimizer step (after step(), or "
                               "before the backward)",
                           where=rec["line"]))
    return out
