"""The logged check's reading of what a logged number claims (_logged_judge.py): a rank's own
number (its last micro-batch's loss, its loss scaled for accumulation) is the global one the log
should show only where the script itself reduces that step's loss across ranks; elsewhere it is
a rank's own sample of the loss (nanoGPT logs rank 0's last micro-batch, knowingly)."""
from __future__ import annotations


def _close(a, b, rel=2e-5):
    return a is not None and b is not None and abs(a - b) <= rel * max(abs(a), abs(b), 1e-6)


def claims(ev, micro):
    """{(rank, step)}: the steps whose loss the script itself reduces across ranks (an
    all_reduce, in the step or just after its optimizer step, of a value equal to the rank's own
    loss, mean, sum or accumulation-scaled loss of the step): a number it logs for that step
    is meant to be the global one."""
    out = set()
    for r, rec in enumerate(ev.ranks):
        reduced = {}
        for e in rec.get("logged.reduce", []):
            reduced.setdefault(e["s"], []).extend(e["before"] or [])
        for s, m in (micro[r].items() if r < len(micro) else ()):
            n, k = sum(c for _, c in m), len(m)
            total = sum(v for v, _ in m)
            own = sum(v * c for v, c in m) / n if n else None
            mine = [x for x in (own, total, total / k, m[-1][0]) if x is not None]
            mine += [x / k for x in mine[:2]]
            if any(_close(b, x) for b in reduced.get(s, []) + reduced.get(s + 1, [])
                   for x in mine):
                out.add((r, s))
    return out


def settle(formulas, claimed):
    """A rank's own-number formula ("local") is wrong where the script claims the step's global
    loss, else this rank's own (a note)."""
    for r, steps in formulas.items():
        for s, fs in steps.items():
            steps[s] = [(f[0], ("wrong" if (r, s) in claimed else "own"), *f[2:])
                        if f[1] == "local" else f for f in fs]
