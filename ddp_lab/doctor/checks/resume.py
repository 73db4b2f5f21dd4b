"""A resumed run continues the run it resumes: the state a checkpoint's reader steps with is the
state its writer had, and every rank resumes from the same one.

Rank side (construction, save and load time; per step only a flag is read):
- the optimizers, LR schedulers and GradScalers the script builds (ctx.on_built), each with the
  user's frames that built it;
- torch.save: when what is saved holds an optimizer's state (optimizer.state_dict()), the live
  schedulers attached to that optimizer (scheduler.optimizer) and the enabled GradScalers that
  step it (scaler.step(optimizer)), each held in the save or not, with their position (a
  scheduler's last_epoch and lr; a scaler's scale) ("resume-saves");
- optimizer.load_state_dict: the file the state came from (torch.load's result, by id); at that
  optimizer's next step (or scaler.step(optimizer)), the schedulers' and scalers' positions it
  steps with, and the scheduler and scaler states the file holds (the word of a writer from an
  earlier run) ("resume-continues");
- an optimizer's first step: digests of the DDP model's parameters it steps and of their
  optimizer state ("resume-starts"), compared across ranks in the parent; at that step, another
  optimizer that loaded a state over the same parameters and never stepped ("resume-unused");
- torch.load and tempfile.mkdtemp called from the user's code ("resume-reads", "resume-folders"):
  which rank read a checkpoint, and a folder each rank made for itself.
"""
from __future__ import annotations

import sys
import time
import weakref

from ._resume_judge import judge
from ._resume_saved import (Origins, contents, holds_optimizer, is_optimizer_state, lrs,
                            parts_of, path_of, state_digests, states_held)
from .api import Check


def user_stack(ctx, frame, limit: int = 12) -> list:
    """The user's frames from `frame` outward, innermost first, as user lines."""
    out = []
    while frame is not None and len(out) < limit:
        if ctx.is_user_file(frame.f_code.co_filename):
            out.append(ctx.user_line(frame))
        frame = frame.f_back
    return out


class _Rank:
    def __init__(self, ctx):
        self.ctx = ctx
        self.optimizers = weakref.WeakKeyDictionary()  # optimizer -> info
        self.schedulers = weakref.WeakKeyDictionary()  # scheduler -> {line}
        self.scalers = weakref.WeakKeyDictionary()  # GradScaler -> {line, stepped}
        self.origins = Origins()
        self.pending: list = []  # loaded optimizers that have not stepped since
        self.file_states: dict = {}  # file read -> the scheduler and scaler states it holds
        self.starts = 0

    # --- what the script builds ----------------------------------------------------------
    def optimizer_built(self, ctx, opt, frame) -> None:
        info = {"ord": len(self.optimizers), "line": ctx.user_line(frame),
                "stack": user_stack(ctx, frame), "first": True, "load": None, "due": True}
        self.optimizers[opt] = info
        stepping = ctx.guard(self.stepping)
        opt.register_step_pre_hook(lambda o, args, kwargs: stepping(o, info) if info["due"] else None)

    def scheduler_built(self, ctx, sched, frame) -> None:
        self.schedulers[sched] = {"line": ctx.user_line(frame)}

    def scaler_built(self, ctx, scaler, frame) -> None:
        self.scalers[scaler] = {"line": ctx.user_line(frame), "stepped": weakref.WeakSet()}

    # --- steps -----------------------------------------------------------------------------
    def stepping(self, opt, info, scaler=None) -> None:
        """An optimizer steps (or a scaler is about to step it) while something is due."""
        load = info["load"]
        if load is not None and not load.get("seen"):
            load["seen"] = True
            self.continued(opt, info, load, scaler)
            self.pending = [p for p in self.pending if p["info"] is not info]
        if scaler is None and info["first"]:
            info["first"] = False
            self.first_step(opt, info)
        info["due"] = info["first"]

    def first_step(self, opt, info) -> None:
        ctx = self.ctx
        found = state_digests(ctx, opt)
        if found is not None:
            ctx.add("resume-starts", {"i": self.starts, "ord": info["ord"], "step": ctx.step,
                                      "line": info["line"], **found})
            self.starts += 1
        if info["load"] is not None:
            return  # it loaded a state itself: nothing loaded is lost by its stepping
        mine = {id(p) for g in opt.param_groups for p in g["params"]}
        for p in [p for p in self.pending if p["info"] is not info]:
            if any(id(r()) in mine for r in p["params"] if r() is not None):
                self.pending.remove(p)
                ctx.add("resume-unused", {"loaded": p["info"]["stack"], "load": p["where"],
                                          "stepping": info["stack"], "step": ctx.step})

    def continued(self, opt, info, load, scaler) -> None:
        scheds = [{"cls": type(s).__name__, "pos": s.last_epoch, "lr": lrs(s.get_last_lr()),
                   "line": si["line"]} for s, si in list(self.schedulers.items())
                  if getattr(s, "optimizer", None) is opt]
        scalers = [sc for sc, si in list(self.scalers.items()) if opt in si["stepped"]]
        scalers += [scaler] if scaler is not None and scaler not in scalers else []
        self.ctx.add("resume-continues", {
            "ord": info["ord"], "step": self.ctx.step, "file": load["file"], "where": load["where"],
            "at": load["at"], "schedulers": scheds, "held": self.file_states.get(load["file"], []),
            "scalers": [{"cls": type(sc).__name__, "scale": sc.get_scale(),
                         "line": self.scalers.get(sc, {}).get("line", "")}
                        for sc in scalers if sc.is_enabled()]})

    def scaler_steps(self, scaler, opt) -> None:
        si = self.scalers.get(scaler)
        if si is not None and opt not in si["stepped"]:
            si["stepped"].add(opt)
        info = self.optimizers.get(opt)
        if info is not None and info["load"] is not None and not info["load"].get("seen"):
            self.stepping(opt, info, scaler)

    # --- saves and loads ---------------------------------------------------------------------
    def saved(self, obj, f, frame) -> None:
        found = contents(obj)
        states = [x for x in found if is_optimizer_state(x)]
        optimizers = [(o, i) for o, i in list(self.optimizers.items())
                      if any(x is o for x in found) or (states and holds_optimizer(states, o))]
        if not optimizers:
            self.saved_states(obj, frame)
            return
        parts = [p for o, i in optimizers for p in parts_of(self, found, o, i)]
        self.ctx.add("resume-saves", {"where": self.ctx.user_line(frame), "file": path_of(f),
                                      "at": time.time(), "step": self.ctx.step,
                                      "optimizers": [i["ord"] for _, i in optimizers], "parts": parts})

    def saved_states(self, obj, frame) -> None:
        """A save without an optimizer's state may hold a scheduler's or scaler's: a checkpoint
        written as several files (transformers' optimizer.pt, scheduler.pt, scaler.pt)."""
        held = states_held(contents(obj))
        if held:
            self.ctx.add("resume-saves", {"where": self.ctx.user_line(frame), "file": None,
                                          "at": time.time(), "step": self.ctx.step,
                                          "optimizers": [], "parts": [], "states": held})

    def read(self, obj, f, frame) -> None:
        path = path_of(f)
        if path is None:
            return
        self.origins.remember(obj, path)
        self.file_states[path] = states_held(contents(obj))  # a writer of another run's
        where = self.ctx.user_line(frame)
        if where:
            self.ctx.add("resume-reads", {"where": where, "file": path, "step": self.ctx.step})

    def optimizer_loaded(self, opt, state, frame) -> None:
        info = self.optimizers.get(opt)
        if info is None:
            return
        info["load"] = {"file": self.origins.file_of(state), "where": self.ctx.user_line(frame),
                        "at": time.time()}
        info["due"] = True
        if isinstance(state, dict) and state.get("state"):
            self.pending = [p for p in self.pending if p["info"] is not info] + [{
                "info": info, "where": info["load"]["where"],
                "params": [weakref.ref(p) for g in opt.param_groups for p in g["params"]]}]

    def folder_made(self, path, frame) -> None:
        import tempfile

        while frame is not None and frame.f_code.co_filename == tempfile.__file__:
            frame = frame.f_back  # TemporaryDirectory() calls mkdtemp
        if frame is not None and self.ctx.is_user_file(frame.f_code.co_filename):
            self.ctx.add("resume-folders", {"line": self.ctx.user_line(frame), "path": path})


def attach(ctx) -> None:
    import tempfile

    import torch
    import torch.serialization
    from torch.optim.lr_scheduler import LRScheduler

    rank = _Rank(ctx)
    ctx.on_built([torch.optim.Optimizer], rank.optimizer_built)
    ctx.on_built([LRScheduler], rank.scheduler_built)
    ctx.on_built([torch.amp.GradScaler], rank.scaler_built)
    _wrap(ctx, torch.serialization, "save", lambda out, at, obj, f, *a, **k: rank.saved(obj, f, at),
          also=torch)
    _wrap(ctx, torch.serialization, "load", lambda out, at, f, *a, **k: rank.read(out, f, at),
          also=torch)
    _wrap(ctx, torch.optim.Optimizer, "load_state_dict",
          lambda out, at, opt, state, *a, **k: rank.optimizer_loaded(opt, state, at))
    _wrap(ctx, tempfile, "mkdtemp", lambda out, at, *a, **k: rank.folder_made(out, at))
    step = torch.amp.GradScaler.step
    seen = ctx.guard(rank.scaler_steps)

    def scaler_step(scaler, optimizer, *args, **kwargs):
        seen(scaler, optimizer)  # per step: two weak lookups
        return step(scaler, optimizer, *args, **kwargs)

    torch.amp.GradScaler.step = scaler_step


def _wrap(ctx, owner, name: str, after, also=None) -> None:
    """owner.name (and also.name, when it is the same function) replaced by a function that
    calls it, then `after(result, caller's frame, *args, **kwargs)` under ctx.guard, unless a
    check is the caller."""
    import functools

    fn = getattr(owner, name)
    after = ctx.guard(after)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not ctx.checking:
            after(out, sys._getframe(1), *args, **kwargs)
        return out

    if also is not None and getattr(also, name, None) is fn:
        setattr(also, name, wrapped)
    setattr(owner, name, wrapped)


CHECK = Check(
    name="resume",
    mechanism="a resumed run continues the run it resumes: the scheduler and GradScaler state "
              "its optimizer steps with, the optimizer that loaded the state, the same state on "
              "every rank",
    lesson="17",
    codes={"resume-state-lost": "warning", "resume-state-not-saved": "info",
           "loaded-state-not-used": "warning", "ranks-resume-differently": "error"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_resume.py",
    notes=("torch.save and torch.load files only: a DCP checkpoint's optimizer state is not read",
           "a scheduler or scaler is compared with its writer's when the same run wrote the "
           "file, else with the states the file holds (a file of an earlier run without them is "
           "not judged); a checkpoint only written is a note",
           "a sampler's epoch and the RNG states a checkpoint holds or not are not judged",
           "ranks' resumed states are compared at an optimizer's first step, for the parameters a "
           "DDP model holds"))
