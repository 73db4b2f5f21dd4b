"""The sanity check on each rank (sanity.py says what it judges).

- Every scalar a backward starts from (the loss), read once as a float; the first non-finite one
  recorded ("sanity.loss"), every one counted ("sanity.summary").
- The optimizers' parameters before the steps the state check hashes (0-4, then every 10th) and
  when the script ends: the first check that finds a non-finite value ("sanity.params"). One
  `_foreach_norm` over the local tensors (a DTensor's shard), per tensor only when it is not
  finite.
- `Module.to_empty` (wrapped at its class): the tensors it leaves hold whatever memory held. From
  then until the next optimizer step, every in-place write (checks/_context_writes.py `in_place_functions`: nn.init, `x.uniform_`,
  load_state_dict's `copy_`) marks its tensor written, with the user's line and function; the
  tensors still unwritten at that step are recorded ("sanity.uninitialised") with, in the
  module's own order, the initialisations around the first of them: the line before which
  theirs is missing.
"""
from __future__ import annotations

import math
import sys

from .api import in_place_functions, written_by

FIRST, EVERY = 5, 10  # the state check's schedule


def due(step: int) -> bool:
    return step < FIRST or (step + 1) % EVERY == 0


class SanityRank:
    def __init__(self, ctx):
        self.ctx = ctx
        self.losses = self.bad_losses = 0
        self.params_bad = False
        self.finite_until = None  # the last step before which every parameter was finite
        self.checked = -1
        self.fresh: dict[int, tuple] = {}  # id or ("ptr", p) -> (root index, name)
        self.roots: list[dict] = []  # per to_empty: {module, line, names, written: {name: (line, fn)}}
        self.funcs = None
        self.last_groups: list = []  # the last stepping optimizer's param groups (sanity.py)

    # --- the loss ------------------------------------------------------------------------------
    def backward(self, func, args, kwargs, result) -> None:
        t = args[0] if args else kwargs.get("tensors", kwargs.get("self"))
        if isinstance(t, (list, tuple)):
            t = t[0] if len(t) == 1 else None
        if t is None or not hasattr(t, "numel") or t.numel() != 1:
            return
        self.losses += 1
        v = float(getattr(t, "_local_tensor", t).detach())  # a DTensor's local value: no collective
        if not math.isfinite(v):
            self.bad_losses += 1
            if self.bad_losses == 1:
                self.ctx.add("sanity.loss", {"s": self.ctx.step, "v": repr(v), "line": self.ctx.user_line()})

    # --- the parameters ------------------------------------------------------------------------
    def before_step(self, opt) -> None:
        if self.fresh:
            self._stop_watching()
        step = self.ctx.step
        if self.params_bad or step == self.checked or not due(step):
            return
        self.checked = step
        self._finite([p for g in opt.param_groups for p in g["params"]], f"before step {step}", step)

    def at_exit(self, optimizers) -> None:
        if not self.params_bad and self.ctx.step and not any(k in self.ctx.records for k in ("error", "hung")):
            groups = [g for opt in optimizers for g in opt.param_groups] or self.last_groups
            params = [p for g in groups for p in g["params"]]
            self._finite(params, f"when the script ended (after step {self.ctx.step - 1})", self.ctx.step)
        self.ctx.emit("sanity.summary", {"losses": self.losses, "non_finite_losses": self.bad_losses,
                                         "finite_until": self.finite_until})

    def _finite(self, params, when: str, step: int) -> None:
        import torch

        local = [getattr(p, "_local_tensor", p).detach() for p in params]
        local = [t for t in local if t.numel() and t.is_floating_point()]
        if not local:
            return
        try:
            norms = torch._foreach_norm(local, 1)
            fine = bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())
        except (RuntimeError, TypeError):
            fine = all(bool(torch.isfinite(t).all()) for t in local)
        if fine:
            self.finite_until = step
            return
        self.params_bad = True
        names = _names(self.ctx)
        bad = [(names.get(id(p), f"#{i} {tuple(p.shape)}"), int((~torch.isfinite(t)).sum()), t.numel())
               for i, (p, t) in enumerate(zip(params, [getattr(p, "_local_tensor", p).detach() for p in params]))
               if t.numel() and t.is_floating_point() and not bool(torch.isfinite(t).all())]
        self.ctx.add("sanity.params", {"s": step, "when": when, "names": [b[0] for b in bad[:6]],
                                       "tensors": len(bad), "values": sum(b[1] for b in bad),
                                       "of": sum(b[2] for b in bad), "finite_until": self.finite_until})

    # --- to_empty ------------------------------------------------------------------------------
    def emptied(self, module, frame) -> None:
        index = len(self.roots)
        names = [("parameter", n, t) for n, t in module.named_parameters()] + \
                [("buffer", n, t) for n, t in module.named_buffers()]
        if not names:
            return
        self.roots.append({"module": module, "line": self.ctx.user_line(frame), "written": {},
                           "order": [n for _, n, _ in names], "seen": set()})
        for _, n, t in names:
            self.fresh[id(t)] = (index, n, t)
            ptr = _ptr(t)
            if ptr:
                self.fresh[("ptr", ptr)] = (index, n, t)
        if self.funcs is None:
            self.funcs = in_place_functions()
            self.ctx.on_torch_function(self.funcs, self.wrote)

    def wrote(self, func, args, kwargs, result) -> None:
        for t in written_by(func, args, kwargs):
            found = self.fresh.get(id(t))
            if found is None or found[2] is not t:
                ptr = _ptr(t)
                found = self.fresh.get(("ptr", ptr)) if ptr else None
                if found is None or _ptr(found[2]) != ptr:
                    continue
            index, name, _ = found
            root = self.roots[index]
            if name not in root["written"]:
                root["written"][name] = (self.ctx.user_line(), _function_of(sys._getframe(1), self.ctx))

    def _stop_watching(self) -> None:
        if self.funcs is not None:
            self.ctx.off_torch_function(self.funcs, self.wrote)
            self.funcs = None
        for index, root in enumerate(self.roots):
            if root.get("done"):
                continue
            root["done"] = True
            now = {n: t for n, t in list(root["module"].named_parameters()) + list(root["module"].named_buffers())}
            left = [n for n in root["order"] if n in now and n not in root["written"]
                    and self.fresh.get(id(now[n]), (None, None, None))[2] is now[n]]
            if left:
                self.ctx.add("sanity.uninitialised", {"s": self.ctx.step, "line": root["line"],
                                                      "names": left[:8], "count": len(left),
                                                      "of": len(root["order"]), **_around(root, left[0])})
        self.fresh.clear()


def _around(root, first: str) -> dict:
    """The initialisations around the first unwritten tensor, in the module's own order: the
    line that initialised the tensor before it and the one after it (in the same user function,
    the line before which its initialisation is missing)."""
    order, written = root["order"], root["written"]
    i = order.index(first)
    before = next((written[n] for n in reversed(order[:i]) if n in written), None)
    after = next((written[n] for n in order[i:] if n in written), None)
    out = {"before": before[0] if before else "", "after": after[0] if after else ""}
    if after and (before is None or before[1] == after[1]):
        out["missing_before"] = after[0]
    return out


def _function_of(frame, ctx):
    """(file, first line) of the user's innermost function on the stack: which function wrote."""
    while frame is not None:
        if ctx.is_user_file(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_code.co_firstlineno
        frame = frame.f_back
    return None


def _ptr(t):
    local = getattr(t, "_local_tensor", t)
    try:
        return local.data_ptr() if local.numel() and local.device.type != "meta" else None
    except (RuntimeError, AttributeError):
        return None


def _names(ctx) -> dict:
    """id(param) -> its name in the models the script wrapped."""
    out = {}
    for w in ctx.models:
        for n, p in w.module.named_parameters():
            out.setdefault(id(p), n)
    return out
