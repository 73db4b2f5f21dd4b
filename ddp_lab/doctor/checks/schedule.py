"""An LR schedule's length is the optimizer steps the run takes: a schedule sized for one process
(its length counts the steps `len(dataset) // batch` gives, while each of W ranks takes 1/W of
them behind a DistributedSampler) ends the run 1/W of the way through it (a cosine at half way,
OneCycle still near its peak).

Rank side: each LR scheduler the script builds (ctx.on_built) whose length is known: OneCycleLR's
total_steps, CosineAnnealingLR's T_max, LinearLR's and PolynomialLR's total_iters, SequentialLR's
last milestone plus its last scheduler's length, and a LambdaLR whose function carries a total
(functools.partial's keyword or a closure's variable named like num_training_steps, total_steps,
max_steps, T_max); where the length was computed (_schedule_source.py); its position (last_epoch)
when it dies or the script ends (nothing per step). A schedule that resumes (built with
last_epoch, its optimizer loaded a state, or any optimizer loads one after it was built: a run
stopped on purpose and continued) is not judged.

Parent: on a rank that ended cleanly, a schedule whose length is about W times the position it
reached (W >= 2, at least 4 steps) is a warning at the line that computed the length.
"""
from __future__ import annotations

import functools
import re
import weakref

from ..userline import describe
from ._schedule_source import length_line
from .api import Check, Finding

LENGTHS = {"OneCycleLR": ("total_steps", "steps_per_epoch"), "CosineAnnealingLR": ("T_max",),
           "LinearLR": ("total_iters",), "PolynomialLR": ("total_iters",)}
LENGTHY = re.compile(r"(num_|n_)?(training_|train_|total_|max_|decay_)?(steps|iters|iterations|updates)"
                     r"|t_max|total(_\w+)?", re.I)
MIN_STEPS = 4


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def lambda_length(fn):
    """(total, its name) carried by a LambdaLR's function, else None."""
    if isinstance(fn, functools.partial):
        for k, v in fn.keywords.items():
            if LENGTHY.fullmatch(k) and _count(v):
                return v, k
        fn = fn.func
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars if code else (), cells):
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if LENGTHY.fullmatch(name) and _count(v):
            return v, name
    return None


def length_of(s):
    """(length, how it is named) of a scheduler, else None."""
    if getattr(s, "_milestones", None) and getattr(s, "_schedulers", None):  # SequentialLR
        last = length_of(s._schedulers[-1])
        return (s._milestones[-1] + last[0], f"milestones[-1] + {last[1]}") if last else None
    for cls in type(s).__mro__:
        if cls.__name__ in LENGTHS:
            v = getattr(s, LENGTHS[cls.__name__][0], None)
            return (v, LENGTHS[cls.__name__][0]) if _count(v) else None
    for fn in getattr(s, "lr_lambdas", None) or ():
        found = lambda_length(fn)
        if found:
            return found
    return None


class _Rank:
    def __init__(self, ctx):
        self.ctx = ctx
        self.tracked: list = []  # (weakref to the scheduler, its record, its __dict__ until it dies)
        self.loaded = weakref.WeakSet()  # optimizers that loaded a state

    def built(self, ctx, s, frame) -> None:
        for m in getattr(s, "_schedulers", ()) if getattr(s, "_milestones", None) else ():
            for ref, rec, _ in self.tracked:
                rec["member"] = rec.get("member") or ref() is m
        found = length_of(s)
        if found is None:
            return
        user = frame
        while user is not None and not ctx.is_user_file(user.f_code.co_filename):
            user = user.f_back
        params = LENGTHS.get(type(s).__name__, (found[1],))
        at = length_line(user, type(s), params, ctx.is_user_file) if user is not None else None
        rec = {"cls": type(s).__name__, "length": found[0], "of": found[1],
               "line": ctx.user_line(frame), "length_line": describe(*at) if at else "",
               "resumed": s.last_epoch > 0 or getattr(s, "optimizer", None) in self.loaded}
        self.read(rec, vars(s))
        # where it stands when it dies: its __dict__, kept until then, still holds it (the
        # dict outlives the object while referenced); nothing is read per step
        held = {"d": vars(s)}
        done = ctx.guard(lambda ref: self.read(rec, held.pop("d")))
        self.tracked.append((weakref.ref(s, done), rec, held))

    @staticmethod
    def read(rec: dict, d: dict) -> None:
        rec["pos"] = d.get("last_epoch", rec.get("pos", 0))
        lr = d.get("_last_lr") or [float("nan")]
        rec["lr"] = float(lr[0])

    def optimizer_loaded(self, opt) -> None:
        self.loaded.add(opt)
        for _, rec, _ in self.tracked:
            rec["resumed"] = True  # a resume after it was built: the run stopped on purpose

    def finish(self, ctx) -> None:
        for _, rec, held in self.tracked:
            if "d" in held:
                self.read(rec, held.pop("d"))
        if self.tracked:
            ctx.emit("schedules", [rec for _, rec, _ in self.tracked])


def attach(ctx) -> None:
    import torch
    from torch.optim.lr_scheduler import LRScheduler

    rank = _Rank(ctx)
    ctx.on_built([LRScheduler], rank.built)
    ctx.on_finish(rank.finish)
    load = torch.optim.Optimizer.load_state_dict
    loaded = ctx.guard(rank.optimizer_loaded)

    @functools.wraps(load)
    def load_state_dict(opt, *args, **kwargs):
        out = load(opt, *args, **kwargs)
        loaded(opt)
        return out

    torch.optim.Optimizer.load_state_dict = load_state_dict


def judge(ev) -> list[Finding]:
    world, out = ev.world_size, {}
    for rank, rec in enumerate(ev.ranks):
        if world < 2 or rec.get("exit") != 0 or rec.get("error"):
            continue
        for s in rec.get("schedules", []) or []:
            length, pos = s["length"], s["pos"]
            if s.get("resumed") or s.get("member") or pos < MIN_STEPS:
                continue
            if max(1.5, 0.7 * world) <= length / pos <= 1.3 * world:
                where = s["length_line"] or s["line"]
                out.setdefault(where, _finding(s, rank, world, where))
    return list(out.values())


def _finding(s: dict, rank: int, world: int, where: str) -> Finding:
    evidence = [f"{s['cls']}({s['of']}={s['length']}) built at {s['line']}: rank {rank} stepped it "
                f"{s['pos']} times, and the run ended {100 * s['pos'] / s['length']:.0f}% of the way "
                f"through it (lr {s['lr']:.3g} at the end)",
                f"{s['length']} is about {world} (the world size) x {s['pos']}: the length counts the "
                f"optimizer steps one process would take, while each of the {world} ranks takes "
                f"1/{world} of them (a DistributedSampler gives each rank 1/{world} of the batches)"]
    if s["length_line"] and s["length_line"] != s["line"]:
        evidence.append(f"the length is computed at {s['length_line']}")
    return Finding(
        "warning", "schedule-sized-for-one-process", "20",
        "the LR schedule is sized for one process: the run ends part way through it", evidence,
        fix="size the schedule in the steps each rank takes: len(train_loader) (a DataLoader over "
            "a DistributedSampler) times the epochs, or the one-process count divided by "
            "dist.get_world_size()",
        where=where)


CHECK = Check(
    name="schedule",
    mechanism="an LR schedule's length is the optimizer steps each rank takes, not one "
              "process's count over the data",
    lesson="20",
    codes={"schedule-sized-for-one-process": "warning"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_schedule.py",
    notes=("schedules whose length is not an attribute (MultiStepLR's milestones, CyclicLR, a "
           "LambdaLR whose total is not a keyword or closure variable named like one) are not "
           "judged",
           "a run stopped early on purpose without a checkpoint, ending at 1/W of its schedule, "
           "reads the same as one sized for one process",
           "a resumed schedule (built with last_epoch, or after an optimizer loaded a state) is "
           "not judged"))
