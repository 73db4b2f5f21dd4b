"""Check 3 and a run that did not end well: the first collective the ranks entered differently
(the flight recorder every launch arms: ddp_lab.launching.flight, divergence), at which step of
the user's loop, and the exception a rank raised, with the user's line."""
from __future__ import annotations

from ..failures import brief
from ..report import Finding
from .checks import steps_of


def step_at(rec: dict, when: float) -> int | None:
    """The step a rank was in at wall-clock time `when` (from the step's begin time)."""
    begun = [i for i, s in enumerate(steps_of(rec)) if s.get("begin", 0) <= when]
    return begun[-1] if begun else None


def first_step_apart(run, recs: list[dict]) -> str:
    """'step 1: rank 0 entered 5 collectives (...), rank 1 entered 0': the first step of the
    user's loop in which the ranks entered different collectives (ops and shapes), or ''."""
    per_rank = {}
    for r in run.ranks:
        if r.collectives is None:
            return ""
        steps: dict = {}
        for c in r.collectives:
            if c.group == "0" and (step := step_at(recs[r.rank], c.created)) is not None:
                steps.setdefault(step, []).append(str(c))
        per_rank[r.rank] = steps
    last = max((max(s, default=-1) for s in per_rank.values()), default=-1)
    for step in range(last + 1):
        seen = {rank: s.get(step, []) for rank, s in per_rank.items()}
        if len({tuple(v) for v in seen.values()}) > 1:
            said = [f"rank {rank} entered {len(v)} collective(s)" + (f" ({', '.join(v[:3])}"
                    f"{', ...' if len(v) > 3 else ''})" if v else "") for rank, v in seen.items()]
            return f"step {step}: " + "; ".join(said)
    return ""


def _same_inputs(parted) -> bool:
    """torch's analyser calls a size mismatch on all_gathers whose inputs every rank gave alike
    (FSDP2's full_tensor in a save: seen on torch 2.13, gloo); the ranks did not differ."""
    entered = [c for c in parted.entries.values() if c is not None]
    return (parted.kind == "size" and len(entered) == len(parted.entries)
            and len({(c.op, c.sizes, c.dtypes) for c in entered}) == 1)


def collective_findings(run, recs: list[dict]) -> list[Finding]:
    from ...launching import divergence

    parted = divergence.find(run.ranks)
    if parted is None or _same_inputs(parted):
        return []
    ev = [line] if (line := first_step_apart(run, recs)) else []
    for rank, c in parted.entries.items():
        last = c or parted.last.get(rank)
        step = step_at(recs[rank], last.created) if last else None
        at = f" in step {step}" if step is not None else ""
        ev.append(f"rank {rank} entered {c.op} #{c.seq} ({c.shape}){at}" if c else
                  f"rank {rank} never entered #{parted.seq}" +
                  (f" (its last: {last.op} #{last.seq}{at})" if last else ""))
    return [Finding(
        "error", "collectives-differ-between-ranks", "13",
        f"the ranks part at collective #{parted.seq} ({parted.kind})",
        ev + [divergence.describe(run.ranks)],
        fix="every rank must run the same steps and call the same collectives in the same order: "
            "decide early stops, skipped batches and rank-0 work with a value all ranks agree on "
            "(all_reduce the flag), never with a per-rank one",
        trace=divergence.table(run.ranks))]


def failure_findings(run, recs: list[dict]) -> list[Finding]:
    found = collective_findings(run, recs)
    root = run.root_cause
    if root is None or root.error is None:
        if run.status == "timeout" and not found:
            return [Finding("error", "hang", "13", f"the ranks hung (stopped after {run.timeout:g} s)",
                            [run.describe_failure()], trace=run.ranks[0].stack_summary())]
        return found
    step = len(steps_of(recs[root.rank])) - 1
    found.append(Finding(
        "error", "step-raised", "06",
        f"rank {root.rank} raised {root.error.type} in step {max(step, 0)}",
        [brief(f"{root.error.type}: {root.error.message}")],
        fix="read the root-cause rank's traceback: later failures on other ranks are "
            "consequences", trace=root.error.traceback[-4000:]))
    return found
