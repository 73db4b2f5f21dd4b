"""The schedule check's reading of the user's source (schedule.py): from the call that built a
scheduler, the line where its length was computed. The argument given for the length is traced
with ast: a name back to its last assignment before the call in the same function (again, while
that assignment is a plain name), or, when the name is the function's parameter, into the caller's
call of the function. An expression written in the call itself is computed on the call's line."""
from __future__ import annotations

import ast
import functools
import inspect

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef)
DEPTH = 4


@functools.lru_cache(maxsize=32)
def parsed(filename: str):
    try:
        with open(filename, encoding="utf-8") as f:
            return ast.parse(f.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None


def name_of(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def call_at(tree, lineno: int, names) -> ast.Call | None:
    """The call on `lineno` (spanning it) named one of `names` (the innermost), else the
    outermost call spanning it."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and n.lineno <= lineno <= (n.end_lineno or n.lineno)]
    named = [c for c in calls if name_of(c) in names]
    if named:
        return max(named, key=lambda c: (c.lineno, -(c.end_lineno or c.lineno)))
    return min(calls, key=lambda c: (c.lineno, -(c.end_lineno or c.lineno))) if calls else None


def argument(call: ast.Call, params, fn=None):
    """The ast node `call` passes for one of `params` (by keyword, or by position in `fn`'s
    signature)."""
    for kw in call.keywords:
        if kw.arg in params:
            return kw.value
    try:
        names = [p for p in inspect.signature(fn).parameters if p != "self"] if fn else []
    except (TypeError, ValueError):
        names = []
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Starred):
            break
        if i < len(names) and names[i] in params:
            return a
    return None


def scope_of(tree, code):
    """The function (or module) of `tree` whose code object is `code`."""
    for node in ast.walk(tree):
        if isinstance(node, SCOPES) and node.name == code.co_name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first == code.co_firstlineno:
                return node
    return tree


def _own_nodes(scope):
    """The statements of `scope`, not those of functions, classes or lambdas inside it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, SCOPES + (ast.ClassDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        return [node.target]
    return []


def _names(target) -> set:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def last_assignment(scope, name: str, before: int):
    found = [n for n in _own_nodes(scope) for t in _targets(n)
             if name in _names(t) and n.lineno < before]
    return max(found, key=lambda n: n.lineno) if found else None


def trace(frame, node, line: int, holds, depth: int = 0):
    """(file, line) where the value `node` (an ast node of `frame`'s code at `line`) was
    computed; None when it is computed on `line` itself (an expression, a constant)."""
    if not isinstance(node, ast.Name) or depth > DEPTH:
        return None
    tree = parsed(frame.f_code.co_filename)
    scope = scope_of(tree, frame.f_code) if tree else None
    if scope is None:
        return None
    assign = last_assignment(scope, node.id, line)
    if assign is not None:
        value = getattr(assign, "value", None)
        deeper = trace(frame, value, assign.lineno, holds, depth + 1) if isinstance(value, ast.Name) else None
        return deeper or (frame.f_code.co_filename, assign.lineno)
    args = getattr(scope, "args", None)
    params = [a.arg for a in (args.posonlyargs + args.args + args.kwonlyargs)] if args else []
    caller = frame.f_back
    if node.id not in params or caller is None or not holds(caller.f_code.co_filename):
        return None
    outer = parsed(caller.f_code.co_filename)
    call = call_at(outer, caller.f_lineno, {scope.name}) if outer else None
    if call is None or name_of(call) != scope.name:
        return None
    offset = 1 if params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute) else 0
    i = params.index(node.id) - offset
    given = next((kw.value for kw in call.keywords if kw.arg == node.id), None)
    if given is None and 0 <= i < len(call.args) and \
            not any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
        given = call.args[i]
    if given is None:
        return None
    return trace(caller, given, caller.f_lineno, holds, depth + 1) or (caller.f_code.co_filename, caller.f_lineno)


def length_line(frame, cls, params, holds):
    """(file, line) where the scheduler built at `frame`'s line got its length (`params`: the
    names its length may be passed as), else None."""
    tree = parsed(frame.f_code.co_filename)
    call = call_at(tree, frame.f_lineno, {cls.__name__}) if tree else None
    if call is None:
        return None
    node = argument(call, params, cls.__init__ if name_of(call) == cls.__name__ else None)
    return trace(frame, node, frame.f_lineno, holds) if node is not None else None
