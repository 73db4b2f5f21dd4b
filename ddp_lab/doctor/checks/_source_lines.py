"""Statements of the user's own files found by what they store, for a judge that knows from the
run THAT a value changed between two points and needs the line that changed it where no hook
can see the write (a plain dict's item, a module's attribute): `stores(files, keys=...)` gives
every line assigning to `x["lr"]` (or `x.update(lr=...)`), `stores(files, attr=...)` every line
assigning to `x.require_backward_grad_sync`. Read once per file; a file that does not parse
gives nothing."""
from __future__ import annotations

import ast
import sys
from functools import lru_cache

from ..userline import describe


@lru_cache(maxsize=64)
def _tree(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        out = []
        for t in node.targets:
            out += list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
        return out
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _stored_key(target) -> str | None:
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
            and isinstance(target.slice.value, str):
        return target.slice.value
    return None


def _updated_keys(node) -> set:
    """Keys a `x.update({...})` / `x.update(k=...)` call stores."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"):
        return set()
    keys = {k.arg for k in node.keywords if k.arg}
    for a in node.args:
        if isinstance(a, ast.Dict):
            keys |= {k.value for k in a.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return keys


def stores(files, keys=(), attr: str | None = None) -> list[str]:
    """`file.py:12: text` of every statement in `files` that stores one of `keys` as a dict item
    (`g["lr"] = ...`, `g["lr"] *= ...`, `g.update(lr=...)`) or assigns the attribute `attr`."""
    keys, out = set(keys), []
    for path in dict.fromkeys(files):
        tree = _tree(path)
        if tree is None:
            continue
        for node in ast.walk(tree):
            hit = any((_stored_key(t) in keys) if keys else False for t in _targets(node))
            hit = hit or bool(keys & _updated_keys(node))
            if attr:
                hit = hit or any(isinstance(t, ast.Attribute) and t.attr == attr for t in _targets(node))
            if hit:
                out.append((path, node.lineno))
    return [describe(p, n) for p, n in sorted(set(out))]


def user_files(ctx) -> list[str]:
    """The script and every module of the user's files the run imported (ctx.is_user_file)."""
    found = [ctx.script]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and ctx.is_user_file(path):
            found.append(path)
    return list(dict.fromkeys(found))
