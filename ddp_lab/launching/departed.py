"""A rank that returned while its peers were still in a collective.

When every failed rank only lost its peers (gloo's "Connection closed by peer") or was stopped
while it waited, and some rank returned normally, the rank that returned is what went wrong:
it left a collective that needs every rank. The evidence is the launcher's own: the returned
rank's exit record (status ok), and for each waiting rank the collective it was in, read from
its traceback (an error), the stack the launcher took before stopping it (a timeout), or
else the last collective the flight recorder saw it enter.

Reads `RankResult`s only through their attributes and methods, so it imports nothing of results.
"""
from __future__ import annotations

import re

_TB_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


def _call_in_traceback(traceback: str) -> str:
    """The innermost public torch.distributed function in a traceback, e.g. `all_reduce()`."""
    calls = [fn for path, fn in _TB_FRAME.findall(traceback)
             if "torch/distributed" in path.replace("\\", "/")
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
        in_dist = any("torch/distributed" in path and f"{fn}()" == where
                      for path, fn in _frames(rank))
        return where if in_dist else ""
    return ""


def _frames(rank):
    return re.findall(r'File "([^"]+)", line \d+ in (\S+)', rank.stack)


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
    it did its part and left (a size or op mismatch, which `parting` names), it did not leave
    the collective unfinished."""
    def seqs(r):
        return {c.seq for c in (getattr(r, "collectives", None) or []) if c.group == "0"}
    done = set().union(*(seqs(r) for r in ranks if r.rank in returned))
    return any(seqs(r) and max(seqs(r)) in done for r in failed)


def describe(ranks) -> str:
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
