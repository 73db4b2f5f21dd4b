"""Findings that name a mechanism, not a symptom. "Differs between ranks" or "no .grad" has many
causes; where the ranks' records show which one, it gets its own finding, evidence and fix, and
the names it explains are left out of the generic findings (measure.py). Where the doctor cannot
tell, the generic finding says what it saw."""
from __future__ import annotations

from ..report import Finding
from .analyze import TOL
from .static import names


def mechanism_findings(recs: list[dict], steps: int) -> tuple[list[Finding], dict[str, set]]:
    """(findings, {state kind: names they explain})."""
    out, explained = [], {"parameter": set(), "buffer": set(), "unregistered_state": set()}
    drifted = _drifted_params(recs[0] if recs else {})
    for find in (_structure, _requires_grad):
        found, names_ = find(recs)
        out += found
        explained["parameter"] |= names_
    for find in (_set_in_forward, _consumed_by_hook):
        found, names_ = find(recs, drifted, steps)
        out += found
        explained["parameter"] |= names_
    found, by_kind = _shape_follows_input(recs)
    out += found
    for kind, names_ in by_kind.items():
        explained[kind] |= names_
    return out, explained


def _drifted_params(rec0: dict) -> dict[str, float | None]:
    table = (rec0.get("drift_end") or {}).get("parameter") or {}
    return {n: d for n, d in table.items() if d is None or not d <= TOL}


def _structure(recs) -> tuple[list[Finding], set]:
    structs = [r.get("structure") for r in recs]
    if len(structs) < 2 or any(s is None for s in structs):
        return [], set()
    ev, base = [], structs[0]
    for r, s in enumerate(structs[1:], 1):
        extra, missing = sorted(set(s) - set(base)), sorted(set(base) - set(s))
        ev += [f"rank {r} has {names(extra)}, which rank 0 lacks"] if extra else []
        ev += [f"rank {r} lacks {names(missing)}, which rank 0 has"] if missing else []
        ev += [f"{n}: shape {tuple(base[n][0])} on rank 0, {tuple(s[n][0])} on rank {r}"
               for n in sorted(set(s) & set(base)) if s[n][0] != base[n][0]][:6]
    if not ev:
        return [], set()
    return [Finding(
        "error", "model-differs-between-ranks", "01",
        "the ranks built different modules (other parameters or shapes)", ev
        + ["DDP checks at construction that every rank holds the same parameters "
           "('DDP expects same model across all ranks'); nothing can be averaged otherwise"],
        "build the same module on every rank: no layer or size that depends on the rank, the "
        "host or per-rank data; decide optional parts from a config every rank reads alike "
        "(or broadcast it from rank 0)")], set().union(*[set(s) for s in structs])


def _requires_grad(recs) -> tuple[list[Finding], set]:
    structs = [r.get("structure") for r in recs]
    if len(structs) < 2 or any(s is None for s in structs):
        return [], set()
    common = sorted(set.intersection(*[set(s) for s in structs]))
    differ = [n for n in common if len({s[n][1] for s in structs}) > 1]
    if not differ:
        return [], set()
    frozen = [f"rank {r}: {names(n for n in differ if not s[n][1]) or 'none'} frozen "
              "(requires_grad=False)" for r, s in enumerate(structs)]
    counts = [sum(1 for n in s if s[n][1]) for s in structs]
    return [Finding(
        "error", "requires-grad-differs-between-ranks", "01",
        f"{len(differ)} parameter(s) are trainable on some ranks and frozen on others", frozen
        + [f"trainable parameters per rank: {counts}", "DDP lists only the parameters with "
           "requires_grad=True, by position: with other counts it refuses to start ('DDP "
           "expects same model across all ranks'); with equal counts and shapes it averages the "
           "gradients of different parameters together"],
        "freeze the same parameters on every rank, before wrapping in DDP (decide from the "
        "config, not from the rank or its data)")], set(differ)


def _set_in_forward(recs, drifted: dict, steps: int) -> tuple[list[Finding], set]:
    written = sorted({n for r in recs for n in ((r.get("dry") or {}).get("set_in_forward") or [])})
    if not written:
        return [], set()
    moved = [n for n in written if n in drifted]
    ev = [f"forward wrote to {names(written)} in place (no optimizer involved): a data-dependent "
          "initialisation or a statistic kept in a parameter"]
    if moved:
        ev += [f"after DDP's broadcast the first forward ran on each rank's own batch: after "
               f"{steps} step(s) {names(f'{n} ({_fmt(drifted[n])})' for n in moved)} differ "
               "between ranks, and DDP never broadcasts parameters again"]
        return [Finding(
            "error", "parameters-set-in-forward", "01",
            f"forward sets {len(written)} parameter(s) from the data, after DDP's broadcast", ev,
            "initialise before wrapping in DDP, on a batch every rank agrees on (or all-reduce "
            "the statistics, or broadcast the parameters from rank 0 after the first step)")], \
            set(written)
    return [Finding(
        "info", "parameters-set-in-forward", "01", f"forward writes {len(written)} parameter(s) "
        "in place", ev + ["the ranks still agreed after the steps"],
        "if this is a data-dependent initialisation, run it before DDP on a batch every rank "
        "agrees on")], set(written)


def _consumed_by_hook(recs, drifted: dict, steps: int) -> tuple[list[Finding], set]:
    dry = [r.get("dry") or {} for r in recs]
    consumed = sorted({n for d in dry for n in d.get("consumed", [])})
    stepped = sorted({n for d in dry for n in d.get("set_in_backward", [])} & {
        n for d in dry for n in d.get("hooked", [])})
    hit = sorted(set(consumed) | set(stepped))
    if not hit:
        return [], set()
    ev = ([f"{names(consumed)}: a post-accumulate-grad hook ran, and .grad was None after "
           "backward (the hook consumed it)"] if consumed else [])
    ev += [f"{names(stepped)}: updated in place during backward"] if stepped else []
    moved = [n for n in hit if n in drifted]
    ev += ([f"after {steps} DDP step(s) {names(moved)} differ between ranks: each rank stepped "
            "with its own gradient, before DDP's all-reduce averaged it"] if moved else
           ["the ranks still agreed after the steps; DDP did not fail"])
    return [Finding(
        "error" if moved else "warning", "gradient-consumed-by-hook", "05",
        f"{len(hit)} parameter(s) are updated by a hook inside backward", ev,
        "step the optimizer after loss.backward() returns (DDP has averaged the gradients by "
        "then); under DDP keep per-parameter hooks read-only")], set(hit)


def _fmt(d) -> str:
    return "not on every rank" if d is None else f"max |difference| {d:.3g}"


def _shape_follows_input(recs) -> tuple[list[Finding], dict[str, set]]:
    shapes = [r.get("shapes") or (r.get("dry") or {}).get("shapes") for r in recs]
    if len(shapes) < 2 or any(s is None for s in shapes):
        return [], {}
    out, by_kind = [], {}
    for kind, label in (("buffer", "buffer"), ("unregistered_state", "plain tensor")):
        tables = [s.get(kind, {}) for s in shapes]
        common = set.intersection(*[set(t) for t in tables])
        differ = sorted(n for n in common if len({tuple(t[n]) for t in tables}) > 1)
        if not differ:
            continue
        by_kind[kind] = set(differ)
        ev = [f"{n}: " + ", ".join(f"rank {r}: {tuple(t[n])}" for r, t in enumerate(tables))
              for n in differ[:6]]
        out.append(Finding(
            "warning", "state-shape-follows-input", "08",
            f"{label}(s) {names(differ, 3)} take their shape from each rank's input", ev
            + ["with per-rank lengths the ranks hold different shapes: a checkpoint from rank 0 "
               "does not match the others"] + ([
                "DDP broadcasts rank 0's buffers to the others before each forward that "
                "follows a grad-enabled one (broadcast_buffers=True): with shapes that differ "
                "that broadcast is "
                "size-mismatched (gloo aborts the process; NCCL can hang or corrupt memory)"]
                if kind == "buffer" else []),
            "size caches from a maximum length fixed in __init__ and slice them in forward; "
            "keep a cache derived from the input out of the buffers (a plain attribute) or "
            "DDP(broadcast_buffers=False)"))
    return out, by_kind
