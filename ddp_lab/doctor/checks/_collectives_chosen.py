"""Read from the script's source (collectives check): whether the value a line hands to a
broadcast was chosen under a branch only some ranks take (`if rank == 0:`, `x if is_main else
None`). Such a broadcast sends what one rank decided on purpose (a path, a seed, weights it
loaded); a value every rank computed the same way, from its own data, is another matter."""
from __future__ import annotations

import ast

from ..userline import source_tree

RANK_WORDS = ("rank", "main", "master", "leader", "chief", "primary", "global_zero", "local_zero")


def _words(node) -> set:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id.lower())
        elif isinstance(n, ast.Attribute):
            out.add(n.attr.lower())
    return out


def rank_test(test) -> bool:
    """A condition that reads which rank this is (a name or attribute naming the rank, the main
    process, the master, ...: `rank == 0`, `dist.get_rank() == 0`, `is_main_process`)."""
    return any(w in word for word in _words(test) for w in RANK_WORDS)


def _scope(tree, lineno: int):
    """The innermost function holding line `lineno`, else the module."""
    found = tree
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                n.lineno <= lineno <= (n.end_lineno or n.lineno) and n.lineno >= getattr(found, "lineno", 0):
            found = n
    return found


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _names_at(scope, lineno: int) -> set:
    """The names the calls on line `lineno` are given (their arguments' names; not the modules
    or objects whose functions they call there: `torch` in `torch.tensor(x)`)."""
    out = set()
    for n in ast.walk(scope):
        if isinstance(n, ast.Call) and n.lineno <= lineno <= (n.end_lineno or n.lineno):
            for a in [*n.args, *(k.value for k in n.keywords)]:
                called = {id(_root(c.func)) for c in ast.walk(a) if isinstance(c, ast.Call)}
                out |= {x.id for x in ast.walk(a) if isinstance(x, ast.Name) and id(x) not in called}
    return out


def _mentions(node, names: set) -> bool:
    return any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(node))


def chosen_at(path: str, lineno: int) -> bool:
    """Whether a value handed over on line `lineno` of `path` was set, before that line in the
    same function, under an `if` (or a conditional expression) that tests the rank."""
    tree = source_tree(path)
    if tree is None:
        return False
    scope = _scope(tree, lineno)
    names = _names_at(scope, lineno)
    if not names:
        return False
    for n in ast.walk(scope):
        if getattr(n, "lineno", lineno) >= lineno:
            continue
        if isinstance(n, ast.If) and rank_test(n.test) and any(
                _mentions(s, names) for s in [*n.body, *n.orelse]):
            return True
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(_mentions(t, names) for t in targets) and any(
                    isinstance(x, ast.IfExp) and rank_test(x.test) for x in ast.walk(n.value)):
                return True
    return False


def chosen(stack) -> bool:
    """Whether any user frame of a broadcast's stack ([path, line], innermost first) hands it
    a value chosen under a rank test (a helper called with one counts)."""
    return any(chosen_at(path, int(line)) for path, line in stack or ())
