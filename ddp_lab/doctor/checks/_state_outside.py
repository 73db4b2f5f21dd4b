"""The state check: where the script built a module whose parameters an optimizer steps but no
wrapped model holds (a learnable loss left out of DDP, a head beside the sharded body). Nothing
reduces their gradients, so they part from the first step; the line at fault is the statement
that made the module and left it unwrapped: the assignment of the script's local that holds it."""
from __future__ import annotations

import ast

from ..userline import describe, source_tree


def built_lines(ctx, frame, wanted: set) -> dict:
    """id(param) -> `file.py:N: text` of the statement that assigned the local holding the
    parameter's module, for the parameters in `wanted` (ids), read in the script's frames from
    `frame` outward (the innermost assignment that holds it)."""
    import torch

    out: dict = {}
    while frame is not None and len(out) < len(wanted):
        if ctx.is_user_file(frame.f_code.co_filename):
            for var, value in list(frame.f_locals.items()):
                if not isinstance(value, torch.nn.Module):
                    continue
                held = [id(p) for p in value.parameters() if id(p) in wanted and id(p) not in out]
                at = _assigned_at(frame, var) if held else ""
                out.update(dict.fromkeys(held, at) if at else {})
        frame = frame.f_back
    return out


def _assigned_at(frame, var: str) -> str:
    """The last statement of the frame's function, up to where it stands, that assigns `var`."""
    path, code = frame.f_code.co_filename, frame.f_code
    tree = source_tree(path)
    if tree is None:
        return ""
    if code.co_name == "<module>":
        body = tree.body
    else:
        fn = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and code.co_firstlineno in (n.lineno, *(d.lineno for d in n.decorator_list))), None)
        body = fn.body if fn is not None else []
    hits = [n.lineno for stmt in body for n in ast.walk(stmt)
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno <= frame.f_lineno
            and any(isinstance(t, ast.Name) and t.id == var
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    return describe(path, max(hits)) if hits else ""
