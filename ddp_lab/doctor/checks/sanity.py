"""What every training run must keep, whatever its parallelism: finite values, and parameters
that hold what the script put there.

- The loss a backward starts from is finite: the first step it is not (a NaN loss means the
  step's update is NaN too, unless a GradScaler skips it).
- The optimizers' parameters are finite, before the steps the state check hashes (0-4, then
  every 10th) and when the script ends: the first check that finds a NaN or an infinity.
- Every parameter and buffer `to_empty` materialises is written before the first optimizer step
  (the meta-device recipe: `to_empty` allocates without initialising; FSDP2's example then calls
  `reset_parameters`): those never written hold whatever memory held. The line: where, in the
  user's own initialisation, the first of them would be initialised (the initialisation that
  follows it in the module's order, when the one before it was made in the same function), else
  the `to_empty` call.

The rank side is _sanity_rank.py.
"""
from __future__ import annotations

import sys
import weakref

from ._sanity_rank import SanityRank
from .api import Check, Finding


def attach(ctx) -> None:
    import torch

    rank = SanityRank(ctx)
    optimizers = weakref.WeakSet()
    to_empty = torch.nn.Module.to_empty

    def to_empty_watched(self, *args, **kwargs):
        out = to_empty(self, *args, **kwargs)
        ctx.guard(rank.emptied)(self, sys._getframe(1))
        return out

    torch.nn.Module.to_empty = to_empty_watched

    def before(opt):
        optimizers.add(opt)
        rank.last_groups = opt.param_groups  # its parameters, for the exit when it is freed
        rank.before_step(opt)

    ctx.on_optimizer_step(before=before)
    ctx.on_torch_function([torch.Tensor.backward, torch.autograd.backward], rank.backward)
    ctx.on_finish(lambda c: rank._stop_watching())
    ctx.on_finish(lambda c: rank.at_exit(list(optimizers)))
    ctx.on_finish(lambda c: torch.nn.Module.to_empty is to_empty_watched
                  and setattr(torch.nn.Module, "to_empty", to_empty))


def judge(ev) -> list[Finding]:
    out = []
    uninit = _same_on_every_rank(ev, "sanity.uninitialised")
    line = ""
    if uninit:
        line = uninit.get("missing_before") or uninit["line"]
        lines = [f"{uninit['count']} of the {uninit['of']} tensors that to_empty materialised at "
                 f"{uninit['line']} were never written before the first step (on every rank): "
                 + ", ".join(uninit["names"][:5]) + (" ..." if uninit["count"] > 5 else ""),
                 "to_empty allocates without initialising: they hold whatever memory held"]
        if uninit.get("missing_before"):
            lines.append(f"the model's own initialisation wrote the tensor before them at {uninit['before']} "
                         f"and the one after them at {uninit['after']}: theirs is missing before that line")
        out.append(Finding("error", "parameters-never-initialised", "02",
                           f"{uninit['count']} parameter(s) or buffer(s) never initialised after to_empty",
                           lines, fix="initialise every submodule after to_empty (call each one's "
                                      "reset_parameters / init_weights, or load a state dict into it)",
                           where=line))
    params = _first(ev, "sanity.params")
    loss = _first(ev, "sanity.loss")
    counts = [r.get("sanity.summary", {}) or {} for r in ev.ranks]
    if params:
        r, rec = params
        lines = [f"rank {r}: {rec['values']} non-finite value(s) in {rec['tensors']} tensor(s) {rec['when']}: "
                 + ", ".join(rec["names"]),
                 "finite " + (f"before step {rec['finite_until']}" if rec["finite_until"] is not None
                              else "at no earlier check")]
        if loss:
            lines.append(f"the loss was first non-finite at step {loss[1]['s']} (rank {loss[0]}): {loss[1]['v']}")
        out.append(Finding("error", "non-finite-parameters", "04",
                           f"parameters are NaN or infinite {rec['when']}", lines,
                           fix="find the first non-finite value: the initialisation, the inputs, the "
                               "learning rate, or a loss that overflows (GradScaler skips such steps)",
                           where=line))
    elif loss:
        r, rec = loss
        bad = sum(c.get("non_finite_losses", 0) for c in counts)
        total = sum(c.get("losses", 0) for c in counts)
        out.append(Finding("warning", "non-finite-loss", "04",
                           f"the loss is {rec['v']} at step {rec['s']}",
                           [f"rank {r}: the backward at {rec['line']} started from {rec['v']}",
                            f"{bad} of the {total} losses backpropagated on all ranks were not finite; "
                            "the parameters stayed finite where they were checked"],
                           fix="find the batch or the operation that overflows (a log of 0, a division "
                               "by a zero count, an fp16 overflow)", where=line))
    return out


def _first(ev, key):
    found = [(rec["s"], r, rec) for r, rank in enumerate(ev.ranks) for rec in rank.get(key, []) or []]
    if not found:
        return None
    _, r, rec = min(found, key=lambda x: (x[0], x[1]))
    return r, rec


def _same_on_every_rank(ev, key):
    """The first record of `key` whose tensors every rank left unwritten (a rank that received
    them by a broadcast instead writes them outside any function watch sees)."""
    recs = [rank.get(key, []) or [] for rank in ev.ranks]
    if not recs or not all(recs):
        return None
    names = set.intersection(*(set(r[0]["names"]) for r in recs))
    return recs[0][0] if names else None


CHECK = Check(
    name="sanity",
    mechanism="values every run must keep: a finite loss and finite parameters from the first step, "
              "and every tensor to_empty materialises initialised before the first step",
    lesson="04",
    codes={"non-finite-parameters": "error", "non-finite-loss": "warning",
           "parameters-never-initialised": "error"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_sanity.py",
    notes=("parameters are checked before steps 0-4, then every 10th, and when the script ends: the "
           "first non-finite step is bracketed between two checks; the loss is checked at every backward",
           "a loss is read as a float at each backward (a synchronisation on an accelerator)",
           "a tensor written only by a collective (a broadcast from rank 0) is not seen written: one "
           "that some rank initialised is not reported"))
