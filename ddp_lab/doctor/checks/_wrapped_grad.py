"""The wrapped check's part for `requires_grad` changed on a DDP model's parameter after DDP(...)
built its reducer (wrapped.py).

DDP's reducer holds the parameters that required grad when DDP(...) was built
(torch/nn/parallel/distributed.py `_build_params_for_reducer`: `if param.requires_grad`) and
hooks their gradient accumulators there; nothing looks at the flag again.
- A parameter unfrozen afterwards (False -> True) has no hook: its gradient is never
  all-reduced, each rank steps it with its own, and the replicas part (blind b45: 4 of 6
  tensors differ after 5 steps). An error, at the line that set the flag.
- A parameter frozen afterwards (True -> False) stays in the reducer, which waits for a gradient
  that never comes: with find_unused_parameters=False DDP raises "Expected to have finished
  reduction in the prior iteration" at the next forward (measured, torch 2.13, gloo; the raised
  check carries PyTorch's error), and with find_unused_parameters=True it marks it unused every
  step (nothing parts; measured). A note in the first case, nothing in the second.

Seen from outside: a Tensor property set goes through the active TorchFunctionMode as
`Tensor.requires_grad.__set__` (torch/overrides.py:1906-1907 indexes each property's __set__;
measured: watch's mode sees `p.requires_grad = x`, `p.requires_grad_()` and
`module.requires_grad_()`, which calls it per parameter). A set is only noted there; at the next
step's end the flag is compared with the reducer's (a flag set and set back before a step, or
a model wrapped again, which builds a new reducer, is nothing).
"""
from __future__ import annotations

from .api import Finding

FROZEN = "requires-grad-frozen"  # this part's own record: parameters frozen after DDP(...)
UNFROZEN = "requires_grad set to True"


class _Grads:
    def __init__(self, ctx, trees):
        self.ctx, self.trees = ctx, trees
        self.params: dict[int, list] = {}  # id(p) -> [p, name, Watched, in the reducer]
        self.pending: dict[int, tuple] = {}  # id(p) -> (line, step) of its first set since a step
        self.frozen: list[tuple] = []  # (row, id of the parameter's module)

    def wrapped(self, ctx, w) -> None:
        if w.kind != "ddp":
            return
        ignored = set(getattr(w.wrapper, "parameters_to_ignore", None) or ())
        owners = {}
        for name, p in w.module.named_parameters():
            self.params[id(p)] = [p, name, w, p.requires_grad and name not in ignored]
            owners[id(p)] = name
        inside = {id(m) for m in w.module.modules()}
        kept = [(row, mid) for row, mid in self.frozen if mid not in inside]
        if len(kept) != len(self.frozen):  # a new reducer: the flags it took are right
            self.frozen = kept
            ctx.emit(FROZEN, [row for row, _ in kept])

    def flag_set(self, func, args, kwargs, result) -> None:
        p = args[0] if args else None
        e = self.params.get(id(p))
        if e is not None and e[0] is p and id(p) not in self.pending:
            self.pending[id(p)] = (self.ctx.user_line(), self.ctx.step)

    def step_ended(self, ctx) -> None:
        if not self.pending:
            return
        groups: dict[tuple, list] = {}
        for pid, (line, step) in self.pending.items():
            p, name, w, held = self.params[pid]
            if p.requires_grad != held:
                groups.setdefault((line, step, p.requires_grad, id(w)), [w]).append(name)
        self.pending.clear()
        for (line, step, now, _), (w, *names) in groups.items():
            owner = id(_owner(w.module, names[0]))
            if now:
                self.trees.record(UNFROZEN, names, w, owner, line=line, step=step)
            elif not getattr(w.wrapper, "find_unused_parameters", False) or \
                    getattr(w.wrapper, "static_graph", False):
                row = {"what": "requires_grad set to False", "names": names[:8], "kind": "ddp",
                       "line": line, "wrapped_at": w.line, "step": step}
                self.frozen.append((row, owner))
                ctx.emit(FROZEN, [r for r, _ in self.frozen])


def _owner(module, name: str):
    path = name.rpartition(".")[0]
    return module.get_submodule(path) if path else module


def attach(ctx, trees) -> None:
    import torch

    grads = _Grads(ctx, trees)
    ctx.on_model(grads.wrapped)
    ctx.on_torch_function((torch.Tensor.requires_grad.__set__, torch.Tensor.requires_grad_),
                          grads.flag_set)
    ctx.on_step_end(grads.step_ended)


def mine(row: dict) -> bool:
    return row.get("what") == UNFROZEN


def unfrozen(c: dict, ranks: list, world: int) -> Finding:
    names = ", ".join(c["names"][:4]) + (" ..." if len(c["names"]) > 4 else "")
    return Finding(
        "error", "model-changed-after-wrap", "01",
        f"a parameter was unfrozen after DDP(...): requires_grad set to True ({names})",
        [f"wrapped at {c.get('wrapped_at') or 'an unknown line'}; unfrozen at step {c['step']} "
         f"on rank(s) {', '.join(map(str, ranks))} of {world}",
         "DDP's reducer took the parameters that required grad when DDP(...) was built "
         "(torch/nn/parallel/distributed.py _build_params_for_reducer) and never looks again: "
         "these have no gradient hook, so their gradients are never all-reduced and each rank "
         "steps them with its own: the replicas part"],
        fix="wrap the model again after changing requires_grad (model = DDP(net)), or build DDP "
            "with every parameter that will ever train requiring grad and keep the frozen ones "
            "out of the optimizer (or zero their lr) until they unfreeze",
        where=c["line"], strategies=("ddp",))


def frozen(ev) -> list[Finding]:
    seen, out = set(), []
    for rec in ev.ranks:
        for c in rec.get(FROZEN, []):
            if (c["line"], c["step"]) in seen:
                continue
            seen.add((c["line"], c["step"]))
            names = ", ".join(c["names"][:4]) + (" ..." if len(c["names"]) > 4 else "")
            out.append(Finding(
                "info", "model-changed-after-wrap", "01",
                f"a parameter was frozen after DDP(...): requires_grad set to False ({names})",
                [f"wrapped at {c.get('wrapped_at') or 'an unknown line'}; frozen at step {c['step']}",
                 "DDP's reducer still waits for their gradients: with find_unused_parameters=False "
                 "DDP raises 'Expected to have finished reduction in the prior iteration' at the "
                 "next forward; with find_unused_parameters=True it marks them unused every step"],
                fix="freeze before DDP(...), or wrap the model again after freezing",
                where=c["line"], strategies=("ddp",)))
    return out
