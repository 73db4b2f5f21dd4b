"""The reference check's line (its judge calls `cause`): where the first parting comes from, read
from one mechanism at a time, each from what the runs recorded; "" where none says so.

- The learning rate parts: the optimizer was given another lr (the line that computed the
  value passed as lr=, e.g. from the per-rank `--batch-size`), else its scheduler moved it
  otherwise (the scheduler's line).
- Every gradient is one multiple c of one process's: the script all_reduced a `.grad` itself on
  top of DDP's average (that line), else the loss backward() ran on is c times one process's
  (the line that scaled it: the logged check's record of the criterion's output down to backward).
- Otherwise (the loss parts, or the gradients part in direction): the first line whose
  batch-shaped tensor holds rows one process does not (_reference_trace.py).
"""
from __future__ import annotations

LINES = "reference.lines"
REDUCED = "reference.grad-reduce"
OPTIMIZERS = "reference.optimizers"
LOCAL_FIX = ("compute it over the global batch, as one process does: gather the tensor from every "
             "rank (with its gradient: torch.distributed.nn.functional.all_gather) before this line")
GENERIC_FIX = ("run the step on one process with the ranks' batches together and compare: the first "
               "tensor that parts is where to look")


def cause(ev, mine: dict, s: int, first: dict, g) -> tuple[str, str, str]:
    """(the line, a sentence saying why, the fix)."""
    if first["what"] == "lr":
        return _learning_rate(ev, mine, first)
    if first["what"] == "gradient" and g is not None:
        found = _grad_reduced(ev, s, g) or _loss_scaled(ev, mine, s, g)
        if found:
            return found
    lines = [x for x in mine.get(LINES, []) if x.get("s") == s]
    if lines:
        x = lines[0]
        if x["why"] == "shape":
            why = (f"{x['name']} at that line has shape {tuple(x['shape'])} on a rank and "
                   f"{tuple(x['reference'])} in one process: a dimension besides the batch's "
                   "follows the rank's own batch (in-batch pairs, negatives)")
        else:
            why = (f"{x['name']} at that line: {x['apart']} of rank 0's {x['shape'][0]} rows are in "
                   "no row of one process's (a statistic over the rank's own batch: a mean, a "
                   "std, a normalisation)")
        return x["where"], why, LOCAL_FIX
    return "", "", GENERIC_FIX


def _learning_rate(ev, mine, first) -> tuple[str, str, str]:
    theirs = [o for o in ev.ranks[0].get(OPTIMIZERS, []) if o["kind"] == "optimizer"]
    own = [o for o in mine.get(OPTIMIZERS, []) if o["kind"] == "optimizer"]
    if theirs and own and theirs[0].get("lrs") != own[0].get("lrs"):
        at = theirs[0].get("lr_line") or theirs[0]["line"]
        why = (f"the optimizer is given lr {theirs[0]['lrs'][0]:.6g} here and "
               f"{own[0]['lrs'][0]:.6g} in one process on the same global batch (made at {at})")
        scaled = [x for x in mine.get("reference.scaled", [])
                  if x.get("dest") and x["dest"] in at.partition(": ")[2]]
        if scaled:
            x = scaled[0]
            why += (f"; it is computed from {x['option']}, the per-rank batch (the reference "
                    f"ran with {x['option']} {x['to']} = {x['from']} x {ev.world_size})")
        return at, why, ("size the learning rate from the global batch (the per-rank batch x the "
                         "world size x the accumulation steps), as one process with that batch would")
    schedulers = [o for o in ev.ranks[0].get(OPTIMIZERS, []) if o["kind"] == "scheduler"]
    if schedulers:
        return (schedulers[0]["line"], f"the schedule ({schedulers[0]['type']}, made there) sets "
                f"lr {first['theirs']:.6g} where one process's sets {first['mine']:.6g}",
                "size the schedule in optimizer steps of the global batch, as one process's")
    return "", "", GENERIC_FIX


def _grad_reduced(ev, s, g):
    done = [x for x in ev.ranks[0].get(REDUCED, []) if x.get("s") == s]
    if not done:
        return None
    x = done[0]
    return (x["line"], f"the script all_reduces the parameters' .grad itself ({x['op']}, "
            f"{x['param']} first) after DDP averaged them over the {ev.world_size} ranks",
            "remove the all_reduce of .grad: DDP (and FSDP2) average the gradients over the ranks "
            "already (divide by the world size only for a model no wrapper averages)")


def _backwards(records, s):
    return [e for e in records.get("logged.train", []) if e.get("s") == s and e.get("fn") == "backward"]


def _loss_scaled(ev, mine, s, g):
    """The loss backward() ran on is g times one process's: the line that scaled it."""
    ranks = [_backwards(r, s) for r in ev.ranks]
    own = _backwards(mine, s)
    if not own or any(len(r) != len(own) for r in ranks) or not all(e["v"] for e in own):
        return None
    ratios = [sum(r[i]["v"] for r in ranks) / len(ranks) / e["v"] for i, e in enumerate(own)]
    if any(abs(x - g) > 1e-3 * max(1.0, abs(g)) for x in ratios):
        return None
    ops = [op for e in ranks[0] for op in e.get("by", [])]
    line = next((op["line"] for op in ops if op.get("ws")), ops[0]["line"] if ops else "")
    return (line, f"the loss backward() runs on is {g:.2f}x one process's on the same batch "
            "(the criterion's value agrees): it is scaled by the world size there, and DDP "
            "averages the gradients over the ranks too",
            "divide the loss only by its accumulation steps: DDP (and FSDP2) already average the "
            "gradients over the ranks")
