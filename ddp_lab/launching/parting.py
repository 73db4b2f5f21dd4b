"""Where ranks part: the first collective the flight recorder saw differently on two ranks.

Reads `RankResult.collectives` (see `ddp_lab.flight`). The ranks part at collective #N when one
rank entered #N and another did not, or when they entered different ops, sizes or dtypes at #N.
Ops are compared by PyTorch's own trace analyser (`torch.distributed.flight_recorder`'s
`Op.match`) when it can be imported, else by op, shapes and dtypes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .flight import Collective

_KINDS = {"COLLECTIVE_TYPE_MISMATCH": "op", "SIZE_OR_SYNTAX_MISMATCH": "size",
          "COLLECTIVE_DTYPE_MISMATCH": "dtype"}


@dataclass
class Parting:
    """The first collective where the ranks differ."""

    seq: int
    kind: str                                  # "missing", "op", "size" or "dtype"
    entries: dict = field(default_factory=dict)  # rank -> Collective at #seq (None: not entered)
    last: dict = field(default_factory=dict)     # rank -> its last recorded Collective
    analyser: str = ""                         # torch's analyser's verdict, e.g. SIZE_OR_SYNTAX_MISMATCH


def _match(a: Collective, b: Collective, ranks: set) -> str:
    """'' when torch's analyser finds a and b the same collective, else its verdict's name."""
    try:
        from torch.distributed.flight_recorder.components.types import MatchState, Op

        members = {a.group: set(ranks)}
        info = Op(a._event(), members, a.group).match(Op(b._event(), members, b.group))
        return "" if info.state not in (MatchState.COLLECTIVE_TYPE_MISMATCH,
                                        MatchState.SIZE_OR_SYNTAX_MISMATCH,
                                        MatchState.COLLECTIVE_DTYPE_MISMATCH) else info.state.name
    except (ImportError, AssertionError, KeyError, ValueError):
        if a.op != b.op:
            return "COLLECTIVE_TYPE_MISMATCH"
        if a.sizes != b.sizes:
            return "SIZE_OR_SYNTAX_MISMATCH"
        return "COLLECTIVE_DTYPE_MISMATCH" if a.dtypes != b.dtypes else ""


def _by_seq(ranks, group: str) -> dict:
    return {r.rank: {c.seq: c for c in r.collectives if c.group == group}
            for r in ranks if r.collectives is not None}


def find(ranks, group: str = "0") -> Parting | None:
    """The first collective of process group `group` where the ranks that left a record differ,
    or None (no record, one rank, or every rank entered the same collectives)."""
    seqs = _by_seq(ranks, group)
    if len(seqs) < 2 or not any(seqs.values()):
        return None
    first = max((min(s) for s in seqs.values() if s), default=1)  # the ring buffer keeps the newest
    last_seq = max(max(s, default=0) for s in seqs.values())
    for n in range(first, last_seq + 1):
        at = {rank: s.get(n) for rank, s in seqs.items()}
        present = [c for c in at.values() if c is not None]
        last = {rank: (s[max(s)] if s else None) for rank, s in seqs.items()}
        if len(present) < len(at):
            return Parting(n, "missing", at, last)
        verdict = next((v for c in present[1:] if (v := _match(present[0], c, set(at)))), "")
        if verdict:
            return Parting(n, _KINDS[verdict], at, last, verdict)
    return None


def _where(r) -> str:
    """What a rank that did not enter the collective was doing instead."""
    if r.status == "timeout":  # the innermost frame of the user's, from `fn  (file)` lines
        frames = [ln.split()[0] for ln in r.stack_text(64).splitlines()
                  if ln.strip() and "torch/" not in ln]
        return f"is in {frames[0]}()" if frames else "was stopped"
    if r.status == "error" and r.error:
        return f"raised {r.error.type}"
    if r.status == "crashed":
        return f"was killed by {r.signal}" if r.signal else "exited"
    return "returned"


def _entered(c: Collective) -> str:
    return f"{c.op} #{c.seq} ({c.shape})"


def describe(ranks) -> str:
    """One line: where the ranks part, or '' when they do not (or left no record)."""
    p = find(ranks)
    if p is None:
        return ""
    by_rank = {r.rank: r for r in ranks}
    said = []
    if p.kind == "missing":
        for rank, c in p.entries.items():
            if c is not None:
                said.append(f"rank {rank} entered {_entered(c)}")
            else:
                prev = p.last[rank]
                was = f"last entered #{prev.seq} ({prev.op})" if prev else "entered no collective"
                said.append(f"rank {rank} {was} and {_where(by_rank[rank])}")
    else:
        said = [f"rank {rank} entered {_entered(c)}" for rank, c in p.entries.items()]
        said[-1] += f" ({p.kind} mismatch; torch's analyser: {p.analyser})"
    return f"flight recorder: the ranks part at collective #{p.seq}: " + "; ".join(said)


def table(ranks, last: int = 6) -> str:
    """Each rank's recorded collectives side by side, one row per sequence number (the `last`
    rows up to the one where the ranks part), that row marked."""
    seqs = _by_seq(ranks, "0")
    if not any(seqs.values()):
        return "(no flight recorder record: the recorder was off, or no rank left one)"
    p = find(ranks)
    top = max(max(s, default=0) for s in seqs.values())
    end = p.seq if p else top
    rows = range(max(1, end - last + 1), top + 1 if p is None else min(top, end + 2) + 1)
    width = max([len(f"{c.op} {c.shape}") for s in seqs.values() for c in s.values()] + [10])
    lines = [("  #    " + "".join(f"rank {k}".ljust(width + 3) for k in seqs)).rstrip()]
    for n in rows:
        cells = [(f"{s[n].op} {s[n].shape}" if n in s else "-").ljust(width + 3)
                 for s in seqs.values()]
        mark = "  <- the ranks part here" if p and n == p.seq else ""
        lines.append(f"  {n:<4} " + "".join(cells).rstrip() + mark)
    return "\n".join(lines)
