"""The training loop, read from the script's source (collectives check): whether a stack runs
inside the loop that steps the optimizer, and the loop's way out (an `if` around a `break`,
else where a `for` loop's iterable was made)."""
from __future__ import annotations

import ast
import os


def _loops(path: str, lineno: int) -> list:
    """The loops of `path` around line `lineno`, innermost first ([] when unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    around = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))
              and n.lineno <= lineno <= (n.end_lineno or n.lineno)]
    return sorted(around, key=lambda n: -n.lineno)


def inside_loop(step_at, frames) -> bool:
    """Whether a stack ([(file, line)]) runs inside the loop that steps the optimizer."""
    loops = _loops(step_at[0], step_at[1])
    if not loops:
        return False
    name, loop = os.path.basename(step_at[0]), loops[0]
    return any(os.path.basename(f) == name and loop.lineno <= int(n) <= loop.end_lineno
               for f, n in frames)


def _breaks(loop) -> list:
    """(the line of the `if` around it, or the break's own) for each break of this loop."""
    found = []

    def visit(node, test_line):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                                  ast.Lambda, ast.ClassDef)):
                continue  # a break there ends another loop
            if isinstance(child, ast.Break):
                found.append(test_line or child.lineno)
            visit(child, child.lineno if isinstance(child, ast.If) else test_line)
    for stmt in loop.body:
        visit(ast.Module(body=[stmt], type_ignores=[]), None)
    return found


def _made_at(path: str, loop) -> int:
    """Where the `for` loop's iterable was assigned (enumerate(x), tqdm(x) unwrapped)."""
    it = loop.iter
    while isinstance(it, ast.Call) and it.args:
        it = it.args[0]
    if not isinstance(it, ast.Name):
        return loop.lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return loop.lineno
    made = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
            and n.lineno < loop.lineno
            and any(isinstance(t, ast.Name) and t.id == it.id
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    return max(made) if made else loop.lineno


def loop_exit(step_at):
    """(line, how) of the training loop's way out: an `if` around a `break` (this loop or one
    around it), else where a `for` loop's iterable was made; (0, "") when unreadable."""
    loops = _loops(step_at[0], step_at[1])
    for loop in loops:
        if breaks := _breaks(loop):
            return breaks[0], f"a `break` whose condition each rank decides alone (line {breaks[0]})"
    if not loops:
        return 0, ""
    if isinstance(loops[0], ast.For):
        made = _made_at(step_at[0], loops[0])
        return made, (f"its `for` loop ran out of batches on one rank first (line {made} makes "
                      "what it iterates)")
    return loops[0].lineno, "its `while` condition turned false on one rank first"
