"""The optimizer check on each rank (optimizer.py says what it judges): what every optimizer is
given and does, recorded at its `step()` — a few floats, a few attribute reads.

- Its hyperparameters (every number of each param group: lr, momentum, betas, weight decay, ...)
  at every step, recorded when they change, with who changed them since the last step: a
  scheduler's `step()` or an optimizer's `load_state_dict`/`add_param_group` (wrapped at their
  classes, each records the user's line when a value changed), else the statements of the
  user's files that store the changed key (`userline.stores`: a plain dict's item has no
  hook), and where it was built.
- Whether any of its parameters ever had a gradient when it stepped.
- Whether the gradients it steps on are fresh: after its step, a few of its gradients are
  remembered (the tensor, weakly, and its version counter); at its next step, the same tensor
  written since (its version moved) and never zeroed in between (Tensor.zero_ and
  torch._foreach_zero_ are watched; zero_grad(set_to_none=True) leaves None, so a new tensor)
  means the backward added onto the last step's gradients.
"""
from __future__ import annotations

import sys
import weakref
import zlib

from ..userline import stores, user_files
from .api import digest

SAMPLED = 8  # gradients remembered per optimizer for the freshness test


def numbers(opt) -> tuple:
    """((key, value), ...) per param group: every hyperparameter that is a number (a bool as
    0/1, a tuple such as betas flattened, a 1-element CPU tensor read; other tensors skipped:
    reading one on an accelerator would synchronise)."""
    out = []
    for group in opt.param_groups:
        row = []
        for key in sorted(group):
            if key == "params":
                continue
            v = group[key]
            if isinstance(v, (bool, int, float)):
                row.append((key, float(v)))
            elif isinstance(v, (tuple, list)) and v and all(isinstance(x, (int, float)) for x in v):
                row += [(f"{key}[{i}]", float(x)) for i, x in enumerate(v)]
            elif type(v).__name__ == "Tensor" and v.numel() == 1 and v.device.type == "cpu":
                row.append((key, float(v)))
        out.append(tuple(row))
    return tuple(out)


class Tracked:
    """One optimizer on this rank."""

    def __init__(self, index: int, line: str):
        self.index, self.line = index, line
        self.k = 0  # its own steps so far
        self.last = None
        self.pending: list[dict] = []  # who changed its hyperparameters since its last step
        self.chain = 0
        self.changes = 0
        self.live = False  # a parameter of it had a gradient at one of its steps
        self.idle = 0  # steps taken while none had, though some require one
        self.sampled: list[tuple] = []  # (param, weakref(grad), version) after its last step
        self.stale = None  # the first step whose gradients held the last step's


class OptimizerRank:
    def __init__(self, ctx):
        self.ctx = ctx
        self.tracked = weakref.WeakKeyDictionary()
        self.every: list[Tracked] = []  # the summary's, freed optimizers' included (a rebuilt one)
        self.count = 0
        self.zeroed: set = set()  # ids and data pointers of tensors zeroed since a step ended
        self.depth = 0  # inside a wrapped scheduler step (SequentialLR steps its children)

    # --- who is who ----------------------------------------------------------------------------
    def made(self, opt, frame) -> None:
        if opt in self.tracked:
            return  # a subclass's __init__ calling ours
        line = self.ctx.user_line(_caller(frame))
        self.tracked[opt] = Tracked(self.count, line)
        self.every.append(self.tracked[opt])
        weakref.finalize(opt, setattr, self.tracked[opt], "sampled", [])  # its parameters, freed with it
        self.count += 1
        self.ctx.add("optimizer.made", {"o": self.tracked[opt].index, "line": line,
                                        "type": type(opt).__name__})

    def of(self, opt) -> Tracked:
        if opt not in self.tracked:
            self.made(opt, sys._getframe(2))
        return self.tracked[opt]

    def wrote(self, opt, what: str, before, frame) -> None:
        """A scheduler's step or an optimizer's load_state_dict/add_param_group returned."""
        if opt is None or opt not in self.tracked or before == numbers(opt):
            return
        self.tracked[opt].pending.append({"line": self.ctx.user_line(frame), "what": what})

    # --- at each step --------------------------------------------------------------------------
    def before_step(self, opt) -> None:
        t = self.of(opt)
        values = numbers(opt)
        if t.k == 0 or values != t.last:
            self._record(opt, t, values)
        t.pending = []
        t.last = values
        if not t.live:
            self._gradients(opt, t)
        if t.sampled and t.stale is None:
            self._freshness(t)
        t.k += 1

    def after_step(self, opt) -> None:
        t = self.tracked.get(opt)
        if t is None:
            return
        t.sampled = []
        if t.stale is None:  # once seen, said once
            for group in opt.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is not None and len(t.sampled) < SAMPLED:
                        t.sampled.append((p, weakref.ref(g), _version(g)))
        self.zeroed.clear()

    def zero(self, func, args, kwargs, result) -> None:
        first = args[0] if args else kwargs.get("self", kwargs.get("tensors"))
        for t in first if isinstance(first, (list, tuple)) else [first]:
            self.zeroed.add(id(t))
            local = getattr(t, "_local_tensor", t)
            try:
                self.zeroed.add(("ptr", local.data_ptr()))
            except (RuntimeError, AttributeError):
                pass

    def _record(self, opt, t: Tracked, values) -> None:
        row = {"o": t.index, "k": t.k, "s": self.ctx.step, "v": [list(map(list, g)) for g in values],
               "by": t.pending if t.k else [{"line": t.line, "what": "built"}] + t.pending}
        if t.k == 0:
            row["shared"] = self._shared(opt)
        elif not t.pending:  # nothing we hook changed it: the user's own statements
            keys = {k.split("[")[0] for g0, g1 in zip(t.last, values) for (k, a), (_, b) in
                    zip(g0, g1) if a != b} if len(t.last) == len(values) else {"lr"}
            row["stores"] = stores(user_files(self.ctx.script, self.ctx.is_user_file), keys)[:5]
        t.changes += 1
        t.chain = zlib.crc32(repr((t.k, values)).encode(), t.chain)
        self.ctx.add("optimizer.hyper", row)

    def _shared(self, opt) -> dict:
        """Whether its parameters are one model across the ranks: a model the script wrapped,
        DTensors, or else a digest of its first parameter (equal on every rank: replicas)."""
        params = [p for g in opt.param_groups for p in g["params"]]
        inside = {id(p) for w in self.ctx.models for p in w.module.parameters()}
        out = {"wrapped": any(id(p) in inside for p in params),
               "dtensor": any(hasattr(p, "placements") for p in params)}
        if params and not out["wrapped"] and not out["dtensor"]:
            out["sample"] = digest(params[0])
        return out

    def _gradients(self, opt, t: Tracked) -> None:
        wants = False
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    t.live = True
                    return
                wants = wants or p.requires_grad
        if wants:
            t.idle += 1
            if t.idle == 2:  # said once, with the step's line
                self.ctx.add("optimizer.idle", {"o": t.index, "line": t.line, "s": self.ctx.step,
                                                "at": self.ctx.user_line(),
                                                "params": sum(len(g["params"]) for g in opt.param_groups),
                                                "elsewhere": _gradients_elsewhere(self.ctx, opt)})

    def _freshness(self, t: Tracked) -> None:
        written = 0
        for p, ref, version in t.sampled:
            g = p.grad
            if g is None or ref() is not g:
                return  # a new tensor: set to None, or replaced
            if _version(g) == version:
                continue  # not written since: no backward reached it
            if id(g) in self.zeroed or ("ptr", _ptr(g)) in self.zeroed:
                return
            written += 1
        if written:
            t.stale = {"o": t.index, "k": t.k, "s": self.ctx.step, "line": self.ctx.user_line(),
                       "built": t.line}
            self.ctx.add("optimizer.stale", t.stale)

    def summary(self) -> None:
        self.ctx.emit("optimizer.summary", [
            {"o": t.index, "line": t.line, "k": t.k, "chain": t.chain, "changes": t.changes,
             "v": [list(map(list, g)) for g in t.last or ()], "live": t.live, "idle": t.idle}
            for t in self.every])


def _version(t) -> tuple:
    """The version counters of a gradient: the tensor's (AccumulateGrad adds into it in place,
    a DTensor's included) and a DTensor's local tensor's (FSDP2 accumulates into
    `grad._local_tensor` in place: fsdp/_fully_shard/_fsdp_collectives.py:749)."""
    return t._version, getattr(t, "_local_tensor", t)._version


def _ptr(t):
    try:
        return getattr(t, "_local_tensor", t).data_ptr()
    except (RuntimeError, AttributeError):
        return None


def _caller(frame):
    """The frame that built the optimizer: past the __init__ of an optimizer class in the
    user's files (class MyOpt(Optimizer): super().__init__(...))."""
    from torch.optim import Optimizer

    f = frame
    while f is not None and f.f_code.co_name == "__init__" and isinstance(f.f_locals.get("self"), Optimizer):
        f = f.f_back
    return f or frame


def _gradients_elsewhere(ctx, opt) -> list[str]:
    """Parameters of the script's modules (its frames' locals) that have gradients but are not
    this optimizer's: the model it trains holds other tensors than the ones it was given."""
    import torch

    mine = {id(p) for g in opt.param_groups for p in g["params"]}
    found, seen, frame = [], set(), sys._getframe(1)
    while frame is not None and len(found) < 4:
        if ctx.is_user_file(frame.f_code.co_filename):
            for var, value in list(frame.f_locals.items()):
                if isinstance(value, torch.nn.Module) and id(value) not in seen:
                    seen.add(id(value))
                    found += [f"{var}.{n}" for n, p in value.named_parameters()
                              if p.grad is not None and id(p) not in mine][:4 - len(found)]
        frame = frame.f_back
    return found
