"""The reference check's reading of the user's source (its other parts use it): the expression a
call at a frame's line gives one of its arguments (`DataLoader(ds, batch_size=args.batch_size)`,
`SGD(params, lr=lr)`), and the assignment that last gave a name its value in the function
running there (`lr = BASE_LR * args.batch_size / 64`), with its line."""
from __future__ import annotations

import ast
import functools
import linecache


@functools.lru_cache(maxsize=64)
def tree(filename: str):
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def call_argument(frame, names: tuple, keyword: str, position: int):
    """The expression given as `keyword` (or positional argument `position`) to the call, at
    `frame`'s line, of a callable whose name contains one of `names` (any call when `names` is
    empty and it is given as `keyword`); None when none."""
    found = tree(frame.f_code.co_filename)
    if found is None:
        return None
    line = frame.f_lineno
    for node in ast.walk(found):
        if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if names and not any(n in name for n in names):
                continue
            for kw in node.keywords:
                if kw.arg == keyword:
                    return kw.value
            if names and len(node.args) > position:
                return node.args[position]
    return None


def assignment(frame, name: str):
    """The last `name = ...` before `frame`'s line in the function (or module) running there."""
    found_tree = tree(frame.f_code.co_filename)
    if found_tree is None:
        return None
    line, found = frame.f_lineno, None
    scopes = [n for n in ast.walk(found_tree)
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno <= line <= (n.end_lineno or n.lineno)]
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else found_tree
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno < line and any(
                isinstance(t, ast.Name) and t.id == name
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            if found is None or node.lineno > found.lineno:
                found = node
    return found


def assigned(frame, name: str):
    """The value of that assignment (see `assignment`), or None."""
    node = assignment(frame, name)
    return node.value if node is not None else None


def source_line(frame, names: tuple, keyword: str, position: int) -> int:
    """The line where the value a call at `frame`'s line gives `keyword` was made: the
    assignment of the name passed (`lr=lr`: the line `lr = ...`), else the call's own line."""
    node = call_argument(frame, names, keyword, position)
    if isinstance(node, ast.Name):
        made = assignment(frame, node.id)
        if made is not None:
            return made.lineno
    return frame.f_lineno
