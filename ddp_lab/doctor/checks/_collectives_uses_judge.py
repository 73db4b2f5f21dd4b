"""The collectives check's judge of what a collective's result is used for (the records of
_collectives_undefined.py and _collectives_uses.py):

- `read-while-undefined`: a rank read a tensor a collective had left undefined there: an async
  collective's output before its wait() (the line is the read's), or a reduce's tensor on a rank
  that is not its destination (the line is the reduce's: the fix is there).
- `broadcast-drops-rank-values`: a broadcast replaced a value every rank had computed after its
  own forward, and the ranks' values differed: one rank's decided for all.
- `gradients-reduced-again`: an all_reduce of gradients DDP had already averaged: summed, every
  update is W times DDP's (an error); averaged again, a wasted all_reduce (a warning).
"""
from __future__ import annotations

import math

from ._collectives_chosen import chosen
from ._collectives_undefined import KEY as READS
from ._collectives_uses import BROADCASTS, GRADS
from .api import Finding

GLOO = ("on gloo (measured with this build, torch 2.13) the other ranks hold, element by "
        "element, their own value, a partial sum or the full one; NCCL writes the root's only")


def judge_uses(ev) -> list:
    return _reads(ev) + _broadcasts(ev) + _grads(ev)


# --- read while undefined ------------------------------------------------------------------------

def _reads(ev) -> list:
    by_made: dict = {}
    for r, rec in enumerate(ev.ranks):
        for e in rec.get(READS, []):
            by_made.setdefault((e["route"], e["made"]), {}).setdefault(r, []).append(e)
    out = []
    for (route, made), per_rank in by_made.items():
        r = min(per_rank)
        e = per_rank[r][0]
        ranks = ", ".join(str(x) for x in sorted(per_rank))
        said = [f"rank {x} read it at {h[0]['read'] or 'a line outside your script'} "
                f"({h[0]['how']}) in step {h[0]['step']}"
                + (f", and after {len(h) - 1} later call(s) of the collective too" if len(h) > 1 else "")
                for x, h in sorted(per_rank.items())[:4]]
        if route == "async":
            out.append(Finding(
                "error", "read-while-undefined", "19",
                "a collective's result is read before its wait()",
                [f"dist.{e['op']}(..., async_op=True) at {made or 'a line outside your script'} "
                 f"(step {e['made_step']}) returns at once: its tensor is undefined until the "
                 "Work it returned is waited for (work.wait())", *said,
                 "what was read is whatever part of the collective had reached the tensor then "
                 "(often the rank's own value)"],
                fix="call work.wait() before reading the tensor (or call the collective without "
                    "async_op)", where=e["read"] or made))
        else:
            out.append(Finding(
                "error", "read-while-undefined", "19",
                "a reduce's result is read on a rank that is not its destination",
                [f"dist.reduce(dst={e['dst']}) at {made} (step {e['made_step']}) gives the "
                 f"result to rank {e['dst']} only; rank {ranks} read the tensor after it", *said,
                 f"what rank {r} read is not the reduction: {GLOO}"],
                fix="when every rank needs the value use dist.all_reduce (or dist.broadcast it "
                    "from the destination after the reduce); read a reduce's result on its "
                    f"destination only (`if rank == {e['dst']}:`)", where=made))
    return out


# --- a decision taken from one rank's value -------------------------------------------------------

def _same(values) -> bool:
    return all(v == values[0] for v in values[1:])


def _broadcasts(ev) -> list:
    if len(ev.ranks) < 2:
        return []
    calls = []
    for rec in ev.ranks:
        seen, mine = {}, {}
        for e in rec.get(BROADCASTS, []):
            n = seen[e["line"]] = seen.get(e["line"], -1) + 1
            mine[(e["line"], n)] = e
        calls.append(mine)
    out, said = [], set()
    for key in sorted(calls[0], key=lambda k: (calls[0][k]["step"], k[1])):
        at = [c.get(key) for c in calls]
        if key[0] in said or any(e is None for e in at) or not all(e["open"] for e in at):
            continue
        values = [e["v"] for e in at]
        if _same(values) or any(None in v for v in values) or chosen(at[0]["stack"]):
            continue
        said.add(key[0])
        e = at[0]
        held = "; ".join(f"rank {r} held {_short(v)}" for r, v in enumerate(values))
        out.append(Finding(
            "warning", "broadcast-drops-rank-values", "14",
            "one rank's value decided for every rank (a broadcast of a value each rank computed)",
            [f"in step {e['step']}, before dist.{e['op']}(src={e['src']}): {held}",
             "each rank computed it the same way after its own forward in this step (from its "
             f"own data); the broadcast gave every rank rank {e['src']}'s, so the others' were "
             "dropped: what they saw in their data decided nothing"],
            fix="combine every rank's value instead of taking one: dist.all_reduce with "
                "ReduceOp.MAX for a flag any rank may raise, SUM (then divide) for a metric; "
                "broadcast only what one rank decides alone (a seed, a path, weights it loaded, "
                "set under `if rank == 0:`)", where=e["line"]))
    return out


def _short(v: list) -> str:
    text = [f"{x:.6g}" if isinstance(x, float) else str(x) for x in v[:4]]
    return "[" + ", ".join(text) + (", ...]" if len(v) > 4 else "]")


# --- gradients reduced again on top of DDP --------------------------------------------------------

def _grads(ev) -> list:
    rec = next((r for r in ev.ranks if r.get(GRADS)), None)
    if rec is None:
        return []
    out, said = [], set()
    for e in rec[GRADS]:
        if e["line"] in said or e["before"] <= 0:
            continue
        said.add(e["line"])
        now = math.sqrt(e["after"] / e["before"])
        end = math.sqrt(e["end"] / e["before"]) if e.get("end") is not None else None
        summed = "SUM" in e["op"] and not (end is not None and abs(end - 1) < 1e-3)
        names = ", ".join(e["names"]) + (", ..." if e["params"] > len(e["names"]) else "")
        told = [f"DDP (wrapped at {e['model'] or 'a line outside your script'}) already "
                f"averaged these gradients over the {ev.world_size} ranks in backward()",
                f"in step {e['step']} this all_reduce ({e['op'].split('.')[-1]}) ran on the "
                f"gradients of {e['params']} of its parameters ({names}): their norm went from "
                f"{math.sqrt(e['before']):.4g} to {math.sqrt(e['after']):.4g} (x{now:.3f})"]
        if end is not None:
            told.append(f"when the optimizer stepped they were x{end:.3f} DDP's")
        if summed:
            out.append(Finding(
                "error", "gradients-reduced-again", "10",
                f"gradients DDP already averaged are summed again: every update is x{end or now:.3g}",
                told + ["every rank applies the same, too large update (the ranks agree: only a "
                        "one-process run shows the difference; as if the learning rate were "
                        f"x{end or now:.3g})"],
                fix="remove the all_reduce of the gradients: DDP averages them during "
                    "backward() (sync by hand only under model.no_sync(), or without DDP)",
                where=e["line"]))
        else:
            out.append(Finding(
                "warning", "gradients-reduced-again", "10",
                "gradients DDP already averaged are all_reduced again (a wasted collective)",
                told + ["the values are unchanged, but every step pays a second all_reduce of "
                        "the gradients"],
                fix="remove the all_reduce of the gradients: DDP averages them during backward()",
                where=e["line"]))
    return out
