"""The reference check's judge (reference.py): the distributed run (ev.ranks) against the
one-process reference (ev.reference["ranks"][0]), step by step.

Only the steps whose data agree are compared (_reference_notes.comparable: the reference's rows at
step k are exactly the union of the ranks'). At each, in the order training makes them: the loss
each criterion computed (the reference's on the global batch against the ranks' combined as one
process's: a mean over every rank's terms, weighted by their counts; a sum, summed), each
parameter's gradient as the optimizer is about to use it, the learning rate, each parameter's
update. The first step and tensor that part beyond the tolerance is the finding, with its
relative difference and ratio; its level says what training does with it: a warning when the
updates part (the run trains something else), an info when only the gradients do and the
optimizer scales the difference away (Adam: a gradient 0.5x gives the same step), an info when a
legitimate per-rank difference explains it (BatchNorm without SyncBatchNorm, dropout left on in a
compiled model). The line comes from _reference_cause.py.
"""
from __future__ import annotations

from ._reference_cause import cause
from ._reference_notes import comparable, global_batch, tolerance
from .api import Finding

COMPARED = "reference.compare"


def judge(ev) -> list[Finding]:
    ref = getattr(ev, "reference", None)
    if not ref:
        return []
    found = global_batch(ev, ref)
    mine = (ref.get("ranks") or [None])[0]
    if ref.get("refused") or not mine:
        return found
    steps, _ = comparable(ev, ref)
    compares = {c["s"]: c for c in mine.get(COMPARED, []) if not c.get("missing")}
    steps = [s for s in steps if s in compares]
    if not steps or (compares[steps[0]].get("init") or 0.0) > 1e-6:
        return found  # nothing comparable, or initial weights that differ (a note says so)
    tol = tolerance(ev, ref)
    for s in steps:
        first = first_tensor(ev, mine, s, compares[s], tol)
        if first is not None:
            return found + [_finding(ev, ref, mine, s, first, [compares[k] for k in steps], tol)]
    return found


def _losses(records: list, s: int) -> list[dict]:
    return [e for e in records.get("logged.train", []) if e.get("s") == s and
            e.get("fn") != "backward" and e.get("grad")]


def loss_parting(ev, mine, s, tol) -> dict | None:
    """The first criterion call of step `s` whose value in one process is not the ranks' combined."""
    ranks = [_losses(r, s) for r in ev.ranks]
    own = _losses(mine, s)
    if not own or any(len(r) != len(own) for r in ranks):
        return None
    for i, e in enumerate(own):
        parts = [r[i] for r in ranks]
        if e.get("red") not in ("mean", "sum") or any(p.get("red") != e["red"] for p in parts):
            continue
        if e["red"] == "sum":
            combined = sum(p["v"] for p in parts)
        else:
            counts = [p.get("n") or 0 for p in parts]
            if not all(counts):
                continue
            combined = sum(p["v"] * n for p, n in zip(parts, counts)) / sum(counts)
        rel = abs(e["v"] - combined) / max(abs(e["v"]), 1e-12)
        if rel > tol["loss"]:
            return {"what": "loss", "name": e["fn"], "i": i, "theirs": combined, "mine": e["v"],
                    "rel": rel, "ratio": combined / e["v"] if e["v"] else None}
    return None


def first_tensor(ev, mine, s: int, c: dict, tol: dict) -> dict | None:
    found = loss_parting(ev, mine, s, tol)
    if found:
        return found
    for row in c["t"]:
        if parts(c, row, 1, tol["grad"]):
            return {"what": "gradient", "name": row[0], "rel": row[1], "ratio": row[2]}
    theirs, own = c["lr"]
    for i, (w, r) in enumerate(zip(theirs, own)):
        if abs(w - r) > 1e-6 * max(abs(r), 1e-12):
            return {"what": "lr", "name": f"group {i}", "theirs": w, "mine": r,
                    "rel": abs(w - r) / max(abs(r), 1e-12), "ratio": w / r if r else None}
    for row in c["t"]:
        if parts(c, row, 3, tol["update"]):
            return {"what": "update", "name": row[0], "rel": row[3], "ratio": row[4]}
    return None


def parts(c: dict, row: list, column: int, tol: float) -> bool:
    """Whether a tensor's gradient (column 1) or update (3) parts from one process's: its relative
    difference beyond `tol`, and its difference beyond `tol` of the whole model's (one process's
    norm over every parameter, where the rows hold it): a gradient near zero (a last layer's bias,
    a sum that cancels) has a relative difference of a float sum's order that is noise."""
    rel = row[column]
    if rel is None or rel <= tol:
        return False
    if rel >= 1e29:
        return True  # one process's is zero, this run's is not
    at = 5 if column == 1 else 6
    if len(row) <= at or row[at] is None:
        return True
    total = sum((r[at] or 0.0) ** 2 for r in c["t"] if len(r) > at) ** 0.5
    return min(rel, 1.0) * row[at] > tol * total if total else True

def uniform(c: dict, column: int) -> float | None:
    """The one ratio every parameter's gradient (column 2) or update (4) has to one process's,
    when they are all that multiple of it (a scale, not a direction); else None."""
    ratios = [row[column] for row in c["t"] if row[column] is not None and row[column - 1] is not None
              and row[column - 1] < 1e29]
    if not ratios:
        return None
    first = ratios[0]
    same = all(abs(r - first) <= 1e-3 * max(1.0, abs(first)) for r in ratios)
    scaled = all(abs(row[column - 1] - abs(row[column] - 1)) <= 1e-3 * max(1.0, abs(row[column]))
                 for row in c["t"] if row[column] is not None)
    return first if same and scaled else None


def _finding(ev, ref, mine, s, first, compares, tol) -> Finding:
    c = compares[[k["s"] for k in compares].index(s)]
    g, u = uniform(c, 2), uniform(c, 4)
    moves = any(parts(k, row, 3, tol["update"]) for k in compares for row in k["t"])
    line, why, fix = cause(ev, mine, s, first, g)
    explained = "" if first["what"] == "lr" else _explained(ev, mine, c, s)
    what = _what(first, g, u)
    level, code = ("info", "reference-explained") if explained else \
        ("warning", "reference-differs") if moves or first["what"] == "lr" else \
        ("info", "reference-gradient-only")
    evidence = [f"step {s} is the first to part, at {_named(first)}: " + _detail(first),
                f"compared: {len(compares)} step(s) with one process; tolerance "
                f"{tol['grad']:.0e} on gradients, {tol['update']:.0e} on updates ({tol['why']})"]
    if u is not None and first["what"] != "update":
        evidence.append(f"every update at step {s} is {u:.2f}x one process's")
    elif not moves:
        evidence.append("the updates agree with one process's within the tolerance: the "
                        "optimizer scales the difference away")
    evidence += [why] if why else []
    evidence += [explained] if explained else []
    evidence += ref.get("plan", {}).get("said", [])[:2]
    return Finding(level, code, "20", f"not what one process trains on the same global batch: {what}",
                   evidence, fix=fix, where=line)


def _named(first) -> str:
    return {"loss": f"the loss ({first['name']})", "gradient": f"the gradient of {first['name']}",
            "lr": f"the learning rate ({first['name']})",
            "update": f"the update of {first['name']}"}[first["what"]]


def _detail(first) -> str:
    if first["what"] in ("loss", "lr"):
        return (f"{first['theirs']:.6g} here, {first['mine']:.6g} in one process "
                f"(relative difference {first['rel']:.2e})")
    ratio = f", {first['ratio']:.3f}x one process's" if first.get("ratio") is not None else ""
    return f"relative difference {first['rel']:.2e}{ratio}"


def _what(first, g, u) -> str:
    if first["what"] == "lr":
        return (f"the learning rate is {first['ratio']:.2f}x one process's "
                f"({first['theirs']:.4g} for {first['mine']:.4g})"
                + (f": every update is {u:.2f}x" if u is not None else ""))
    if first["what"] == "gradient" and g is not None:
        return f"every gradient is {g:.2f}x one process's" + (
            f", every update {u:.2f}x" if u is not None else "")
    if first["what"] == "loss":
        return (f"the loss {first['name']} is {first['theirs']:.4g} over the ranks where one process "
                f"computes {first['mine']:.4g}")
    return f"the {first['what']} of {first['name']} differs by {first['rel']:.1e} (relative)"


def _explained(ev, mine, c, s: int) -> str:
    drawn = [d for d in ev.ranks[0].get("reference.random", []) if d.get("s", s) <= s]
    if drawn:
        return (f"explained: the step draws random numbers itself ({drawn[0]['fn']} at "
                f"{drawn[0]['line']}): each rank draws its own, one process others, so the runs "
                "differ by design there (noise, a random mask); the parting is not judged")
    bn = c.get("bn") or []
    if bn and ev.world_size > 1:
        return (f"explained: BatchNorm without SyncBatchNorm ({', '.join(bn[:3])}) normalises each "
                "rank's batch by its own statistics, one process the global batch's: the runs "
                "differ by design (torch.nn.SyncBatchNorm.convert_sync_batchnorm makes them agree)")
    dropped = [m for r in [ev.ranks[0], mine] for m in r.get("reference.model", [])
               if m.get("compiled_dropout")]
    if dropped:
        return (f"explained: dropout in a compiled model ({', '.join(dropped[0]['compiled_dropout'][:3])}) "
                "draws other masks in each run (it is switched off only outside compiled code)")
    return ""
