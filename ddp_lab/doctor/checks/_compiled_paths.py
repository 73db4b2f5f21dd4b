"""The compiled check's reading of the user's source (the rank side, _compiled_rank.py):

- `on_every_call(ctx, message)`: whether a graph break lies on the path of every call of the
  compiled frame it broke: from the frame dynamo compiles down to the break, each of the user's
  lines (the calls into inlined functions, then the break's own line) sits on its function's
  straight path (under no `if`/`elif`/`else` body, `except`, loop `else` or `match` case; a loop
  body counts as run, a data-dependent `if`'s test is itself on the path), and one of those
  functions is a `forward`. Dynamo compiles such a break once and then RUNS it on every call: the
  graph before it, Python for the breaking line, the graph after it.
- `reads_of(path, line, name)`: for a guard on an attribute `name` that the compiled code read
  at `path:line`: the lines of that function that assign `name` and the lines that load it.
"""
from __future__ import annotations

import ast
import functools
import os
import re

from ..userline import describe

# the statements whose parts run only on some calls: (type, the fields that are conditional)
CONDITIONAL = {ast.If: ("body", "orelse"), ast.Try: ("handlers", "orelse"),
               ast.For: ("orelse",), ast.AsyncFor: ("orelse",), ast.While: ("orelse",),
               ast.Match: ("cases",)}
if hasattr(ast, "TryStar"):
    CONDITIONAL[ast.TryStar] = ("handlers", "orelse")
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
FRAME = re.compile(r'File "(.+?)", line (\d+), in (\S+)')


def tree_of(path: str):
    try:
        return _parsed(path, os.stat(path).st_mtime_ns)
    except OSError:
        return None


@functools.lru_cache(maxsize=16)
def _parsed(path: str, mtime: int):
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _spans(node, line: int) -> bool:
    return getattr(node, "lineno", 0) <= line <= (getattr(node, "end_lineno", None) or 0)


def function_at(tree, line: int):
    """The innermost function (def or lambda) whose lines hold `line`, or None."""
    found, nodes = None, [tree]
    while nodes:
        node = nodes.pop()
        for child in ast.iter_child_nodes(node):
            if _spans(child, line):
                if isinstance(child, FUNCTIONS):
                    found = child
                nodes.append(child)
    return found


def straight(fn, line: int) -> bool:
    """Whether `line` of function `fn` runs on every call that gets that far: no conditional
    part of a statement (CONDITIONAL) between the function and it."""
    node = fn
    while True:
        inner = None
        for field, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST) and _spans(child, line) and not isinstance(
                        child, FUNCTIONS):
                    if field in CONDITIONAL.get(type(node), ()):
                        return False
                    if isinstance(child, ast.stmt) or isinstance(child, ast.excepthandler):
                        inner = child
        if inner is None:
            return True
        node = inner


def on_every_call(ctx, message: str) -> dict:
    """{"forward", "every_call"} for a break dynamo logged (its message's user traceback, cut to
    the frame being compiled: torch._guards.TracingContext.extract_stack()'s first entry)."""
    from torch._guards import TracingContext

    head = message.split("User code traceback:", 1)
    if len(head) < 2:
        return {}  # a duplicate dynamo logs without its stack: the first record holds it
    frames = [(f, int(n), fn) for f, n, fn in FRAME.findall(head[1])]
    root = TracingContext.extract_stack()
    if not frames or not root:
        return {}
    r = root[0]
    start = next((i for i in range(len(frames) - 1, -1, -1)
                  if frames[i][0] == r.filename and frames[i][1] == r.lineno), None)
    if start is None:
        return {}
    forward, every = False, True
    for path, line, _ in frames[start:]:
        if not ctx.is_user_file(path):
            continue
        tree = tree_of(path)
        fn = function_at(tree, line) if tree is not None else None
        if fn is None:
            return {}
        forward = forward or getattr(fn, "name", "") == "forward"
        every = every and straight(fn, line)
    return {"forward": forward, "every_call": every}


def reads_of(path: str, line: int, name: str) -> dict:
    """{"writes": [...], "loads": [...]} (described lines) of attribute `name` in the function
    holding `path:line`, or {} when that function is not found."""
    tree = tree_of(path)
    fn = function_at(tree, line) if tree is not None else None
    if fn is None:
        return {}
    writes, loads = set(), set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and node.attr == name:
            (loads if isinstance(node.ctx, ast.Load) else writes).add(node.lineno)
    loads -= writes  # `self.n = self.n + 1` is the writer's line
    return {"writes": [describe(path, n) for n in sorted(writes)],
            "loads": [describe(path, n) for n in sorted(loads)]}
