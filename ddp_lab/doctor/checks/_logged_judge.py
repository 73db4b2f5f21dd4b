"""The logged check's parent side (ddp_lab/doctor/checks/logged.py records on the ranks): each
logged number against the formulas of its step, of the steps since its line last logged, of the
gradient norm and of an all_reduced metric; a warning where it equals a known wrong formula and
the true value differs, a note where it is one rank's own loss, nothing where it matches none."""
from __future__ import annotations

import math

from ._logged_claims import claims, settle
from ._logged_padding import judge_padding
from ._logged_scale import judge_mass
from .api import KEEP, Finding

REL = 2e-5  # a logged value equals a formula up to float32 rounding of the script's own sums
APART = 1e-3  # a wrong formula is only evidence when it differs from the true value this much


WHY = {
    "unweighted": "an unweighted mean over ranks (and micro-batches) of their losses, while "
                  "they hold different numbers of terms",
    "sum": "the SUM of the ranks' values (an all_reduce not divided by the world size)",
    "accumulation": "the step's loss divided by the number of micro-batches (the loss scaled "
                    "for gradient accumulation, logged as it is)",
    "last": "the last micro-batch's loss only, not the step's",
    "shard": "the gradient norm of this rank's local shard (FSDP2), not of the whole model",
    "fraction": "the unweighted mean of the ranks' fractions, while the ranks evaluated "
                "different numbers of samples",
}
FIX = {
    "unweighted": "all_reduce the sum of loss x count and the count, and log their ratio",
    "sum": "divide the all_reduced SUM by dist.get_world_size() before logging it",
    "accumulation": "log the sum of the scaled micro-batch losses (or the unscaled loss "
                    "averaged over micro-batches), not a scaled one alone",
    "last": "sum loss.detach() over the step's micro-batches (divided by their number) and "
            "log that",
    "shard": "log grad_norm.full_tensor() (every rank calls it), not the local part",
    "fraction": "all_reduce the correct count and the sample count, and log their ratio",
}


def _close(a, b):
    return a is not None and b is not None and abs(a - b) <= REL * max(abs(a), abs(b), 1e-6)


def _apart(a, b):
    return abs(a - b) > APART * max(abs(a), abs(b), 1e-6)


def _complete(events):
    """The records of the steps recorded whole: when the core's cap (KEEP items a key) cut the
    list, its last step may lack micro-batches, and a part of a step is not judged."""
    if len(events) < KEEP:
        return events
    last = max(e["s"] for e in events)
    return [e for e in events if e["s"] != last]


def _micro(events):
    """{step: [(loss, count), ...]} of one rank, with each step's backward factor; a step whose
    losses we cannot read (two losses for one backward, a sum reduction) is left out."""
    steps, bad = {}, set()
    for s in sorted({e["s"] for e in events}):
        pending, micro = [], []
        for e in (e for e in events if e["s"] == s):
            if e["fn"] != "backward":
                if e["grad"]:
                    pending.append(e)
            elif len(pending) == 1 and pending[0]["red"] == "mean" and pending[0]["n"] > 0:
                micro.append((pending[0]["v"], pending[0]["n"], e["v"]))
                pending = []
            else:
                bad.add(s)
        k = len(micro)
        factors = {round(b / v, 6) if v else None for v, _, b in micro}
        if k and s not in bad and not pending and all(
                f is not None and (_close(f, 1.0) or _close(f, 1.0 / k)) for f in factors) \
                and len(factors) == 1:
            steps[s] = [(v, n) for v, n, _ in micro]
    return steps


def _evals(events):
    """{step: [(mean, count), ...]} of the losses computed without gradient (an evaluation),
    for the steps where every such loss is a mean or a sum (its mean: sum / count)."""
    out = {}
    for e in events:
        if e["fn"] != "backward" and not e["grad"]:
            out.setdefault(e["s"], []).append(e)
    return {s: [(e["v"] / e["n"] if e["red"] == "sum" else e["v"], e["n"]) for e in es]
            for s, es in out.items()
            if all(e["red"] in ("mean", "sum") and e.get("n", 0) > 0 for e in es)}


def _formulas(per_rank, out, accumulation=True):
    """out[rank][step] += [(value, kind, reason, text, true)]: the true value, then wrong ones,
    then this rank's own (a note), for every step all ranks read."""
    common = set.intersection(*(set(p) for p in per_rank)) if per_rank else set()
    for s in common:
        micro = [p[s] for p in per_rank]
        n = [sum(c for _, c in m) for m in micro]
        own = [sum(v * c for v, c in m) / nr for m, nr in zip(micro, n)]
        mean = [sum(v for v, _ in m) / len(m) for m in micro]
        true = sum(o * nr for o, nr in zip(own, n)) / sum(n)
        k = len(micro[0]) if accumulation and len({len(m) for m in micro}) == 1 else 0
        counts = "; ".join(f"rank {r}: {o:.6g} over {nr:g} terms" for r, (o, nr) in
                           enumerate(zip(own, n)))
        shared = [(true, "true", "", "")]
        for per in (own, mean) if accumulation else (own,):
            shared += [(sum(per) / len(per), "wrong", "unweighted", counts),
                       (sum(per), "wrong", "sum", counts)]
        if k > 1:
            last = [m[-1][0] for m in micro]
            shared += [(true / k, "wrong", "accumulation", f"k = {k} micro-batches"),
                       (sum(mean) / len(mean) / k, "wrong", "accumulation", f"k = {k}"),
                       (sum(last) / len(last), "wrong", "last", f"k = {k}"),
                       (sum(last) / len(last) / k, "wrong", "last", f"k = {k}")]
        for r in out:
            mine = [(own[r], "own", "", counts), (mean[r], "own", "", counts)]
            if k > 1:  # this rank's own numbers: wrong only where the script claims a global one
                mine += [(own[r] / k, "local", "accumulation", f"k = {k} micro-batches"),
                         (micro[r][-1][0], "local", "last", f"k = {k} micro-batches"),
                         (micro[r][-1][0] / k, "local", "last", f"k = {k} micro-batches")]
            out[r].setdefault(s, []).extend(
                f + (true,) for f in shared + mine if f[1] not in ("wrong", "local")
                or _apart(f[0], true))


def _norm_formulas(ev, out):
    """The model's gradient norm (clip_grad_norm_'s, or the ranks' shard norms added in
    squares) is true; one rank's shard norm is wrong where it differs."""
    norms = [{e["s"]: e for e in r.get("logged.norm", [])} for r in ev.ranks]
    for s in set.intersection(*(set(n) for n in norms)) if norms else ():
        row = [n[s] for n in norms]
        shards = [e.get("shard") for e in row]
        full = row[0]["v"] if row[0]["v"] is not None and (
            row[0].get("replicated") or None in shards) else (
            math.sqrt(sum(x * x for x in shards)) if None not in shards else None)
        if full is None:
            continue
        text = "the shards' norms: " + "; ".join(
            f"rank {r}: {x:.6g}" for r, x in enumerate(shards) if x is not None)
        for r in out:
            out[r].setdefault(s, []).append((full, "true", "", "", full))
            if shards[r] is not None and _apart(shards[r], full):
                out[r][s].append((shards[r], "wrong", "shard", text, full))


def _fraction_formulas(ev, out):
    groups = {}
    for r, rec in enumerate(ev.ranks):
        for e in rec.get("logged.reduce", []):
            groups.setdefault(e["i"], {})[r] = e
    for g in groups.values():
        # str(ReduceOp.SUM) is "RedOpType.SUM"; AVG runs on this build's gloo too (measured:
        # 2 ranks, torch 2.13 CPU, all_reduce(op=AVG) of 1 and 2 gives 1.5 on both)
        if len(g) != ev.world_size or any(
                len(e["before"]) != 1 or e["op"].upper().rsplit(".", 1)[-1] not in ("SUM", "AVG")
                for e in g.values()):
            continue
        b = [g[r]["before"][0] for r in range(ev.world_size)]
        n = [g[r]["rows"] for r in range(ev.world_size)]
        if min(n) <= 0 or len(set(n)) == 1 or not all(0 <= x <= 1 for x in b) or any(
                abs(x * m - round(x * m)) > 1e-3 for x, m in zip(b, n)):
            continue
        true = sum(x * m for x, m in zip(b, n)) / sum(n)
        text = "; ".join(f"rank {r}: {x:.6g} of {m} samples" for r, (x, m) in enumerate(zip(b, n)))
        wrong = ((sum(b) / len(b), "fraction"), (sum(b), "sum"))
        found = [(true, "true", "", "", true)] + [
            (v, "wrong", why, text, true) for v, why in wrong if _apart(v, true)]
        for r in out:
            out[r].setdefault(g[r]["s"], []).extend(found)


def _window(micro, first, last):
    """Each rank's micro-batches over steps first..last as one step, or None when the window is
    one step or holds a step not read on some rank."""
    steps = range(max(first, 0), last + 1)
    if len(steps) < 2 or not all(s in m for m in micro for s in steps):
        return None
    return [{0: [x for s in steps for x in m[s]]} for m in micro]


def _windows(micro, first, last, cache):
    """The formulas of the steps since a line last logged (an epoch's mean), by rank."""
    if (first, last) not in cache:
        per, out = _window(micro, first, last), {q: {} for q in range(len(micro))}
        if per:
            _formulas(per, out, False)
        cache[first, last] = {q: out[q].get(0, []) for q in out}
    return cache[first, last]


def _verdicts(ev, formulas, micro=()):
    """{line: [(kind, reason, rank, step, value, formula value, text, true)]}: each logged
    number against the formulas of its step and the step before (a loss printed after
    optimizer.step() is recorded in the next step), and of the steps since the line last
    logged. A line that logs several times in a step logs micro-batches, knowingly: the
    step-level "last" and "1/k" formulas are not its."""
    lines, per_step = {}, {}
    for r, rec in enumerate(ev.ranks):
        for e in rec.get("logged.value", []):
            per_step[r, e["line"], e["s"]] = per_step.get((r, e["line"], e["s"]), 0) + 1
    micro_lines = {line for (_, line, _), n in per_step.items() if n > 1}
    cache = {}
    for r, rec in enumerate(ev.ranks):
        before = {}
        for e in rec.get("logged.value", []):
            cands = []
            for s in (e["s"], e["s"] - 1):
                cands += [f + (s,) for f in formulas.get(r, {}).get(s, [])
                          if e["line"] not in micro_lines or f[2] not in ("last", "accumulation")]
            p, before[e["line"]] = before.get(e["line"], -1), e["s"]
            if micro and e["line"] not in micro_lines:
                for first, last in ((p, e["s"] - 1), (p + 1, e["s"])):  # after / inside a step
                    cands += [f + (last,) for f in _windows(micro, first, last, cache)[r]]
            for v in e["v"]:
                hit = [c for c in cands if _close(v, c[0]) or (
                    c[2] in ("fraction", "") and _close(v / 100, c[0]))]
                got = next((c for kind in ("true", "wrong", "own") for c in hit
                            if c[1] == kind), None)
                if got:
                    lines.setdefault(e["line"], []).append(
                        (got[1], got[2], r, got[5], v, got[0], got[3], got[4]))
    return lines


def judge(ev):
    formulas = {r: {} for r in range(len(ev.ranks))}
    found, micro = [], []
    if ev.ranks:
        train = [_complete(r.get("logged.train", [])) for r in ev.ranks]
        micro = [_micro(t) for t in train]
        _formulas(micro, formulas)
        settle(formulas, claims(ev, micro))
        _formulas([_evals(t) for t in train], formulas, False)
        found += judge_mass(ev, train) + judge_padding(ev)
    _norm_formulas(ev, formulas)
    _fraction_formulas(ev, formulas)
    for line, seen in _verdicts(ev, formulas, micro).items():
        kinds = {k for k, *_ in seen}
        if "true" in kinds:
            continue  # the line logs the true value at some step: a match elsewhere is chance
        if "wrong" in kinds:
            found.append(_finding("warning", line, [x for x in seen if x[0] == "wrong"]))
        elif "own" in kinds and not any(f.code == "logged-value-one-rank" for f in found):
            found.append(_finding("info", line, [x for x in seen if x[0] == "own"]))
    return found


def _finding(severity, line, seen):
    kind, why, rank, step, v, _, text, true = seen[0]
    steps = sorted({x[3] for x in seen})
    if severity == "info":
        what = "last micro-batch's loss" if why == "last" else "loss"
        return Finding(
            "info", "logged-value-one-rank", "14",
            f"rank {rank} logs its own {what}, not the loss over all ranks' data",
            [f"rank {rank} logs {v:.6g} at step {step}; over all ranks' data it is {true:.6g} "
             f"({text})", "a note: every rank trains on the global gradient all the same; the "
                          "logged number is one rank's sample of the loss"],
            fix="all_reduce the sum of loss x count and the count, and log their ratio, if the "
                "log must show the global loss", where=line)
    what = "gradient norm" if why == "shard" else "metric" if why == "fraction" else "loss"
    return Finding(
        "warning", "logged-value-not-global", "14",
        f"the {what} logged is {WHY[why]}",
        [f"rank {rank} logs {v:.6g} at step {step}; its true global value is {true:.6g}"
         + (f" (the sum over ranks and micro-batches of loss x count, divided by the sum of "
            f"counts)" if what == "loss" else ""),
         f"{v:.6g} is {WHY[why]}: {text}",
         f"the same at {len(seen)} logged value(s), " + (
             f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}")],
        fix=FIX[why], where=line)
