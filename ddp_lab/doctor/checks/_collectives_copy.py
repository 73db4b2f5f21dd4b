"""The collectives check: a collective that writes its result into a copy nothing keeps
(`collective-output-discarded`).

all_reduce, broadcast and reduce write their result into the tensor they are given (torch 2.13's
docstrings in torch/distributed/distributed_c10d.py: "tensor ... Input and output of the
collective. The function operates in-place."). Given a new tensor made in the call's own
argument from one the script holds (`dist.all_reduce(p.grad.float())`, `x.clone()`,
`t.to(torch.float32)`), the result lands in that copy, which nothing refers to once the
statement ends: the tensor the script meant keeps this rank's own values. A no-op conversion
returns the tensor itself (`.float()` of a float32 tensor), which stays held: not judged.

On each rank, the script's own call only: the argument, read from the call's line, is a method
call on an expression that is not a module (`torch.zeros(1)` is a new tensor the script may
reduce only to wait for the others); the tensor given is no view (`_base` is None: a view of a
held tensor writes into it); it is followed by a weak reference, and when the step ends it is
gone. One record per line.
"""
from __future__ import annotations

import ast
import types
import weakref
from functools import lru_cache

from ..userline import source_tree
from ._collectives_alias import per_line
from .api import Finding

KEY = "collective-discarded"
IN_PLACE = ("all_reduce", "broadcast", "reduce")


@lru_cache(maxsize=256)
def _argument(path: str, lineno: int, op: str):
    """The call's tensor argument as written (an ast node), from the statement at `lineno`: read
    once per call site (a per-parameter loop calls it every step)."""
    tree = source_tree(path)
    if tree is None:
        return None
    for n in ast.walk(tree):
        if (isinstance(n, ast.Call) and n.lineno <= lineno <= (n.end_lineno or n.lineno)
                and getattr(n.func, "attr", getattr(n.func, "id", None)) == op):
            return n.args[0] if n.args else next((k.value for k in n.keywords if k.arg == "tensor"), None)
    return None


def _a_copy(frame, node) -> bool:
    """Whether `node` makes a tensor from another: a method called on an expression whose root
    name is not a module (`p.grad.float()`, not `torch.zeros(1)`)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    root = node.func.value
    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
        root = root.func if isinstance(root, ast.Call) else root.value
    if not isinstance(root, ast.Name):
        return True
    value = frame.f_locals.get(root.id, frame.f_globals.get(root.id))
    return not isinstance(value, types.ModuleType)


class Copies:
    """The script's in-place collectives given a copy: followed until their step ends."""

    def __init__(self, ctx):
        self.ctx, self.followed, self.seen = ctx, [], set()
        ctx.on_step_end(self.step_ended)

    def given(self, op: str, bound: dict, line: str, frame) -> None:
        import torch

        t = bound.get("tensor")
        if op not in IN_PLACE or line in self.seen or not isinstance(t, torch.Tensor) \
                or t._base is not None \
                or not _a_copy(frame, _argument(frame.f_code.co_filename, frame.f_lineno, op)):
            return
        self.followed.append((weakref.ref(t), op, line, self.ctx.step))

    def step_ended(self, ctx) -> None:
        for ref, op, line, step in self.followed:
            if ref() is None and line not in self.seen:
                self.seen.add(line)
                ctx.add(KEY, {"op": op, "line": line, "step": step})
        self.followed.clear()


def judge_discarded(ev) -> list:
    out = []
    for line, per_rank in per_line(ev, KEY).items():
        e = per_rank[min(per_rank)]
        out.append(Finding(
            "error", "collective-output-discarded", "13",
            f"dist.{e['op']} writes its result into a copy that nothing keeps",
            [f"dist.{e['op']} at {line} (step {e['step']}) was given a new tensor made in its "
             "argument from one the script holds; it writes its result into that tensor "
             "(in-place: torch/distributed/distributed_c10d.py), and nothing referred to it when "
             "the step ended: the result was never read",
             "the tensor the copy was made from keeps this rank's own values",
             f"seen on rank {', '.join(str(r) for r in sorted(per_rank))}"],
            fix="reduce the tensor itself, or keep the copy in a name and write it back: "
                "`g = p.grad.float(); dist.all_reduce(g); p.grad.copy_(g)`",
            where=line))
    return out
