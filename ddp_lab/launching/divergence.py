"""Where the ranks stop agreeing, read from what a launch brings back. Two shapes of one failure:

- The first collective the flight recorder saw differently on two ranks (`find`, `describe`,
  `table`; see `ddp_lab.launching.flight`): one rank entered #N and another did not, or they
  entered different ops, sizes or dtypes at #N. Ops are compared by PyTorch's own trace
  analyser (`torch.distributed.flight_recorder`'s `Op.match`) when it can be imported, else by
  op, shapes and dtypes.
- A rank that returned while its peers were still in a collective (`returned_while`,
  `describe_returned`). When every failed rank only lost its peers (gloo's "Connection closed
  by peer") or was stopped while it waited, and some rank returned normally, the rank that
  returned is what went wrong: it left a collective that needs every rank. The evidence is the
  launcher's own: the returned rank's exit record (status ok), and for each waiting rank the
  collective it was in, read from its traceback (an error), the stack the launcher took before
  stopping it (a timeout), or else the last collective the flight recorder saw it enter.

Reads `RankResult`s only through their attributes and methods, so it imports nothing of results.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .flight import Collective
from .frames import FRAME

_KINDS = {"COLLECTIVE_TYPE_MISMATCH": "op", "SIZE_OR_SYNTAX_MISMATCH": "size",
          "COLLECTIVE_DTYPE_MISMATCH": "dtype"}
TORCH_DISTRIBUTED = "torch/distributed"  # where a collective lives in a stack


# ---- the first collective the ranks entered differently (the flight recorder) ----------------

@dataclass
class Divergence:
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


def find(ranks, group: str = "0") -> Divergence | None:
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
            return Divergence(n, "missing", at, last)
        verdict = next((v for c in present[1:] if (v := _match(present[0], c, set(at)))), "")
        if verdict:
            return Divergence(n, _KINDS[verdict], at, last, verdict)
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


# ---- a rank that returned while its peers were in a collective ---------------------------------

def _call_in_traceback(traceback: str) -> str:
    """The innermost public torch.distributed function in a traceback, e.g. `all_reduce()`."""
    calls = [fn for path, _, fn in FRAME.findall(traceback)
             if TORCH_DISTRIBUTED in path.replace("\\", "/")
             and not fn.startswith(("_", "wrapper"))]
    return f"{calls[-1]}()" if calls else ""


def _last_recorded(rank) -> str:
    collectives = getattr(rank, "collectives", None) or []
    return f"{collectives[-1].op}()" if collectives else ""


def waiting_in(rank) -> str:
    """The collective a failed rank was in ('' when the evidence shows none)."""
    if rank.status == "error" and rank.error:
        return (_call_in_traceback(rank.error.traceback) or _last_recorded(rank)
                or "a collective")  # a lost peer is only seen while communicating
    if rank.status == "timeout":
        where = rank.stuck_in()
        in_dist = any(TORCH_DISTRIBUTED in path and f"{fn}()" == where
                      for path, _, fn in FRAME.findall(rank.stack))
        return where if in_dist else ""
    return ""


def _ranks(numbers) -> str:
    numbers = list(numbers)
    return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(map(str, numbers))


def returned_while(ranks) -> tuple[list[int], dict[int, str]]:
    """(the ranks that returned, {waiting rank: the collective it was in}), or ([], {}) when
    the run does not have that shape: a rank failed on its own, none returned, or a failed rank
    was not in a collective."""
    failed = [r for r in ranks if r.status != "ok"]
    returned = [r.rank for r in ranks if r.status == "ok"]
    if not failed or not returned or not all(r.is_collateral for r in failed):
        return [], {}
    waiting = {r.rank: waiting_in(r) for r in failed}
    if not all(waiting.values()) or _took_part(ranks, failed, returned):
        return [], {}
    return returned, waiting


def _took_part(ranks, failed, returned) -> bool:
    """The flight recorder saw a returned rank enter the collective a failed rank is stuck in:
    it did its part and left (a size or op mismatch, which `find` names), it did not leave
    the collective unfinished."""
    def seqs(r):
        return {c.seq for c in (getattr(r, "collectives", None) or []) if c.group == "0"}
    done = set().union(*(seqs(r) for r in ranks if r.rank in returned))
    return any(seqs(r) and max(seqs(r)) in done for r in failed)


def describe_returned(ranks) -> str:
    """'rank 1 returned while rank 0 was in all_reduce()', or '' (see `returned_while`)."""
    returned, waiting = returned_while(ranks)
    if not returned:
        return ""
    calls = set(waiting.values())
    if len(calls) == 1:
        inside = f"{_ranks(waiting)} {'was' if len(waiting) == 1 else 'were'} in {calls.pop()}"
    else:
        inside = " and ".join(f"rank {k} {'was ' if i == 0 else ''}in {c}"
                              for i, (k, c) in enumerate(waiting.items()))
    return f"{_ranks(returned)} returned while {inside}"
