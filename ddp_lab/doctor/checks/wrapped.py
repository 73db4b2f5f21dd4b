"""A model changed after it was wrapped: a parameter replaced or added, a module with parameters
set in, or the model cast or moved, after `DDP(...)` (or a parameter or module set into a model
after `fully_shard`); a parameter's requires_grad changed after `DDP(...)` built its reducer is
_wrapped_grad.py's (tests/doctor/checks/test_wrapped_grad.py).

DDP takes its parameters once, in its constructor (torch/nn/parallel/distributed.py:895
`_module_parameters`, :1523 `_build_params_for_reducer`, :1437 the Reducer holding them) and hooks
their gradients there: a parameter set in later is never all-reduced (each rank steps it with its
own gradient), and the one it replaced leaves the reducer waiting for a gradient that never comes.
A cast or move after DDP(...) changes the tensors under the reducer's buckets: on this CPU build
the replicas drift apart from the first step (measured: bf16, f16 and f64, gloo). fully_shard
manages the parameters it found (FSDP2 supports a cast afterwards: FSDPModule._apply,
torch/distributed/fsdp/_fully_shard/_fully_shard.py:886), so only a parameter added after it is
flagged there.

Seen from outside with PyTorch's global registration hooks (torch/nn/modules/module.py:191
register_module_parameter_registration_hook, :165 register_module_module_registration_hook) and
Module._apply wrapped (every .to/.half/.double/.cuda goes through it, module.py:930). A change made
by PyTorch's own code (DDP, FSDP) is not the user's; a wrap of the changed module afterwards (the
user wraps it again) makes it right, and the change is forgotten.
"""
from __future__ import annotations

import threading

from ..frames import first_of
from . import _wrapped_grad
from .api import Check, Finding
from .api import MODEL_CHANGES as CHANGES


class _Trees:
    """Every module inside a wrapped model: id -> (qualified name, the Watched)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.modules: dict[int, tuple] = {}
        self.wrappers: dict[int, object] = {}
        self.changes: list[tuple] = []  # (record, id of the module changed)
        self.local = threading.local()

    def add(self, ctx, w) -> None:
        if w.kind not in ("ddp", "fsdp2"):
            return
        inside = {id(m) for m in w.module.modules()}
        kept = [(c, mid) for c, mid in self.changes if mid not in inside]
        if len(kept) != len(self.changes):  # wrapped again after the change: it is right now
            self.changes = kept
            ctx.emit(CHANGES, [c for c, _ in kept])
        for name, m in w.module.named_modules():
            self.modules[id(m)] = (name, w, m)  # the module kept: its id is not reused
        self.wrappers[id(w.wrapper)] = w

    def theirs(self) -> bool:
        """The change comes from PyTorch's own code (DDP, FSDP, an optimizer), not the user's."""
        import sys

        return first_of(sys._getframe(2), self.ctx.is_user_file) != "user"

    def record(self, what: str, names: list, w, module_id: int, line=None, step=None) -> None:
        row = {"what": what, "names": names[:8], "kind": w.kind,
               "line": self.ctx.user_line() if line is None else line,
               "wrapped_at": w.line, "step": self.ctx.step if step is None else step}
        self.changes.append((row, module_id))
        self.ctx.emit(CHANGES, [c for c, _ in self.changes])


def _adopted_by_fsdp(param) -> bool:
    """A DTensor parameter set by Module.load_state_dict(..., assign=True) into a fully_shard'ed
    module: FSDP2 takes it as its sharded parameter in a load_state_dict post-hook
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:221-224 registers it; reset_sharded_param,
    :995-1003, takes the module's new parameter), the way FSDP2's example resumes. DCP's load
    copies into the parameters in place and sets none."""
    import sys

    import torch.nn.modules.module as module_py

    if type(param).__name__ != "DTensor":
        return False
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "load_state_dict" and frame.f_code.co_filename == module_py.__file__:
            return True
        frame = frame.f_back
    return False


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def attach(ctx) -> None:
    import torch
    from torch.nn.modules.module import (register_module_module_registration_hook,
                                         register_module_parameter_registration_hook)

    trees = _Trees(ctx)
    ctx.on_model(trees.add)

    def parameter_set(module, name, param):
        found = trees.modules.get(id(module))
        if param is None or module._parameters.get(name) is param or trees.theirs():
            return
        prefix, w, _ = found
        if w.kind == "fsdp2" and _adopted_by_fsdp(param):
            return
        what = "parameter replaced" if name in module._parameters else "parameter added"
        trees.record(what, [_qualified(prefix, name)], w, id(module))

    def module_set(module, name, sub):
        found = trees.modules.get(id(module))
        if sub is None or module._modules.get(name) is sub:
            return
        names = [n for n, _ in sub.named_parameters()]
        if not names or trees.theirs():
            return
        prefix, w, _ = found
        what = "module replaced" if module._modules.get(name) is not None else "module added"
        trees.record(what, [_qualified(_qualified(prefix, name), n) for n in names], w, id(sub))

    def only_ours(fn):  # every module built anywhere registers: the cheap test first
        guarded = ctx.guard(fn)
        return lambda module, name, value: (guarded(module, name, value)
                                             if id(module) in trees.modules else None)

    register_module_parameter_registration_hook(only_ours(parameter_set))
    register_module_module_registration_hook(only_ours(module_set))
    _wrap_apply(torch, ctx, trees)
    _wrapped_grad.attach(ctx, trees)  # requires_grad changed after DDP(...)


def _wrap_apply(torch, ctx, trees) -> None:
    """Module._apply wrapped: a cast or move of a DDP model (or a module inside it) changes the
    dtype or device of its parameters."""
    apply = torch.nn.Module._apply

    def owner(module):
        w = trees.wrappers.get(id(module))
        if w is None and id(module) in trees.modules:
            w = trees.modules[id(module)][1]
        return w if w is not None and w.kind == "ddp" else None

    def look(w):
        return {n: (str(p.dtype), str(p.device)) for n, p in w.module.named_parameters()}

    def _apply(self, fn, *args, **kwargs):
        w = None if getattr(trees.local, "depth", 0) or not trees.modules or ctx.checking else owner(self)
        before = ctx.guard(look)(w) if w is not None else None
        if before is None:  # not a DDP model, or our look failed: never in the user's way
            return apply(self, fn, *args, **kwargs)
        trees.local.depth = 1
        try:
            out = apply(self, fn, *args, **kwargs)
        finally:
            trees.local.depth = 0
        ctx.guard(_compare)(trees, w, before, look)
        return out

    torch.nn.Module._apply = _apply


def _compare(trees, w, before: dict, look) -> None:
    after = look(w)
    changed = [n for n in before if n in after and before[n] != after[n]]
    if not changed or trees.theirs():
        return
    (dt0, dev0), (dt1, dev1) = before[changed[0]], after[changed[0]]
    what = (f"cast from {dt0} to {dt1}" if dt0 != dt1 else "") + \
           (" and " if dt0 != dt1 and dev0 != dev1 else "") + \
           (f"moved from {dev0} to {dev1}" if dev0 != dev1 else "")
    trees.record(what, changed, w, id(w.module))


def judge(ev) -> list[Finding]:
    seen, out = set(), []
    for rank, rec in enumerate(ev.ranks):
        for c in rec.get(CHANGES, []):
            key = (c["what"], c["line"])
            if key in seen:
                continue
            seen.add(key)
            ranks = [r for r, other in enumerate(ev.ranks)
                     if any((o["what"], o["line"]) == key for o in other.get(CHANGES, []))]
            out.append((_wrapped_grad.unfrozen if _wrapped_grad.mine(c) else _finding)(
                c, ranks, ev.world_size))
    return out + _wrapped_grad.frozen(ev)


def _finding(c: dict, ranks: list, world: int) -> Finding:
    wrapper = "DDP(...)" if c["kind"] == "ddp" else "fully_shard(...)"
    names = ", ".join(c["names"][:4]) + (" ..." if len(c["names"]) > 4 else "")
    if c["kind"] == "ddp":
        why = ("DDP took the model's parameters and hooked their gradients in its constructor: "
               + ("a cast or move afterwards leaves its buckets on the old tensors, and the ranks' "
                  "gradients are no longer averaged" if c["what"].startswith(("cast", "moved")) else
                  "a parameter set in afterwards is never all-reduced (each rank steps it with its "
                  "own gradient), and one it replaced is waited for in vain"))
    else:
        why = ("fully_shard manages the parameters it found: one set in afterwards stays a plain "
               "tensor, trained on each rank's own gradient")
    return Finding(
        "error", "model-changed-after-wrap", "01",
        f"the model was changed after {wrapper}: {c['what']} ({names})",
        [f"wrapped at {c.get('wrapped_at') or 'an unknown line'}; changed at step {c['step']} on "
         f"rank(s) {', '.join(map(str, ranks))} of {world}", why],
        fix=(f"make every change to the model (new heads, resized embeddings, dtype, device) before "
             f"{wrapper}, or wrap the changed model again"),
        where=c["line"], strategies=("ddp",) if c["kind"] == "ddp" else ("fsdp2",))


CHECK = Check(
    name="wrapped",
    mechanism="the model is not changed after DDP(...) or fully_shard wrapped it",
    lesson="01",
    codes={"model-changed-after-wrap": "error"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_wrapped.py",
    notes=("a change made through .data or in place keeps the same tensors: the state check sees "
           "its effect instead",
           "requires_grad is compared with DDP's reducer at the end of the next step: a parameter "
           "frozen after DDP(...) with find_unused_parameters=True is DDP's to handle (marked "
           "unused every step), not a finding"))
