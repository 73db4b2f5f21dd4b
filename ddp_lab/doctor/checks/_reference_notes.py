"""The reference check's reading of the two runs before any tensor (its judge and watch's notes):
which steps saw the same data, the tolerance, the declared global batch, and the notes that say
what the reference did, cost and could not do (a note, never a finding)."""
from __future__ import annotations

from .api import Finding

BATCHES = "reference.batches"
LOADERS = "reference.loaders"
EPS = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}


def _rows(records: dict, s: int) -> tuple[int, list | None]:
    """(samples drawn at step s, their row hashes sorted; None when a batch was too large)."""
    drawn = [b for b in records.get(BATCHES, []) if b.get("s") == s]
    rows = None if any("rows" not in b for b in drawn) else sorted(h for b in drawn for h in b["rows"])
    return sum(b["n"] for b in drawn), rows


def comparable(ev, ref) -> tuple[list[int], int | None]:
    """(the steps whose samples agree, from step 0 on; the first step where they do not, or None):
    the reference's rows at step k are the ranks' rows at step k, all of them and no others."""
    mine = (ref.get("ranks") or [{}])[0]
    out = []
    for s in range(int(ref.get("steps", 0))):
        theirs = [_rows(r, s) for r in ev.ranks]
        n, rows = sum(t[0] for t in theirs), [h for t in theirs for h in (t[1] or [])]
        own_n, own_rows = _rows(mine, s)
        if n == 0 and own_n == 0:
            break
        whole = all(t[1] is not None for t in theirs) and own_rows is not None
        if n != own_n or (whole and sorted(rows) != own_rows):
            return out, s
        out.append(s)
    return out, None


def tolerance(ev, ref) -> dict:
    """Relative tolerances from the precision the step computes in (autocast's, else the
    parameters') and the number of ranks (a float sum in another order)."""
    mine = (ref.get("ranks") or [{}])[0]
    kinds = [p["dtype"] for r in [ev.ranks[0], mine] for p in r.get("reference.precision", [])]
    kinds += [m["dtype"] for m in mine.get("reference.model", []) if m.get("dtype")]
    dtype = max(kinds, key=lambda k: EPS.get(k, 0.0), default="float32")
    eps, n = EPS.get(dtype, EPS["float32"]), max(ev.world_size, 2)
    grad = max(1e-4, 4 * eps * n)
    return {"grad": grad, "loss": grad, "update": max(1e-3, 8 * eps * n),
            "why": f"{dtype}, {ev.world_size} ranks"}


def global_batch(ev, ref) -> list[Finding]:
    """With a declared global batch (--global-batch G): each compared step's samples over the
    ranks against G; a step that trains on another number is a warning at the DataLoader's line
    (lesson 20: a per-rank batch kept while the world grows)."""
    want = ref.get("global_batch")
    if not want:
        return []
    for s in range(int(ref.get("steps", 0))):
        per_rank = [_rows(r, s)[0] for r in ev.ranks]
        if not any(per_rank):
            break
        if sum(per_rank) == want:
            continue
        loaders = ev.ranks[0].get(LOADERS, [])
        drawn = {b["i"] for b in ev.ranks[0].get(BATCHES, []) if b.get("s") == s}
        made = next((x for x in loaders if x["i"] in drawn), loaders[0] if loaders else {})
        micro = len([b for b in ev.ranks[0].get(BATCHES, []) if b.get("s") == s])
        return [Finding(
            "warning", "reference-global-batch", "20",
            f"the ranks train on {sum(per_rank)} samples a step, not the global batch of {want}",
            [f"step {s}: {' + '.join(map(str, per_rank))} samples on the {ev.world_size} ranks"
             + (f" ({micro} micro-batches each)" if micro > 1 else ""),
             f"the DataLoader gives each rank a batch of {made.get('batch')} at every world size: "
             f"the global batch grows with the world (x{ev.world_size} here)"],
            fix=f"derive the per-rank batch (and the accumulation steps) from the world size: "
                f"{want} // (world_size x accumulation steps) per rank",
            where=made.get("line", ""))]
    return []


def notes(ev) -> list[str]:
    """What the reference did, said in the report's notes."""
    ref = getattr(ev, "reference", None)
    if not ref:
        return []
    if ref.get("refused"):
        return [f"--reference: not compared: {ref['refused']}"]
    out = list(ref.get("plan", {}).get("said", []))
    mine = (ref.get("ranks") or [{}])[0]
    steps, apart = comparable(ev, ref)
    if apart is not None:
        out.append(f"--reference: from step {apart} the reference's batch is not the ranks' "
                   "together (data made per rank, a random augmentation, or a sampler's padding "
                   f"at an epoch's end): {len(steps)} step(s) compared" if steps else
                   f"--reference: not compared: the reference's first batch is not the ranks' "
                   "together (data made per rank, or a random augmentation)")
    init = mine.get("reference.init") or {}
    if init.get("differed"):
        out.append("--reference: the initial weights differ between the two runs (the script does "
                   "not seed them): the reference took rank 0's")
    compares = [c for c in mine.get("reference.compare", []) if c["s"] in steps and not c.get("missing")]
    if compares and (compares[0].get("init") or 0.0) > 1e-6:
        out.append("--reference: not compared: the initial weights differ between the two runs "
                   "(FSDP2's, unseeded)")
    elif compares:
        out.append(f"--reference: {len(compares)} step(s) compared with one process on the same "
                   "global batch: the loss, each gradient, the learning rate, each update")
    elif steps:
        out.append("--reference: not compared: no DDP or FSDP2 model stepped by an optimizer was "
                   "seen in both runs (a script that wraps its model only at world size > 1, or a "
                   "model over 50M parameters)")
    dropped = sum(d["n"] for r in [ev.ranks[0], mine] for d in r.get("reference.dropout", []))
    if dropped:
        out.append(f"--reference: dropout was off in both runs for the compared steps "
                   f"({dropped} call(s)): two runs never draw the same masks")
    if ref.get("error"):
        out.append(f"--reference: the reference run stopped early: {ref['error']}")
    seconds = ref.get("seconds") or {}
    if seconds.get("reference") is not None:
        out.append(f"--reference cost: one process for {ref.get('steps')} step(s) took "
                   f"{seconds['reference']:.1f} s (the run on {ev.world_size} ranks: "
                   f"{seconds.get('watched', 0.0):.1f} s)")
    return out
