"""What a notebook cell binds and reads, from its source (ast, statement by statement, a
function's body read where it is defined): the analysis tests/course/test_exercises_both_ways.py
plans the solved runs with, and tests/portable_cells.py the cells the portable-kernel pass needs."""
from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

_BUILTINS = set(dir(builtins))


def python_of(source: str) -> str:
    """A cell's source as Python (IPython's magics turned into calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _stored(nodes) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _binds(stmt) -> tuple[set[str], bool]:
    """(names a top-level statement binds, whether it is an import)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}, False
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}, True
    scoped = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp,
              ast.SetComp, ast.DictComp, ast.GeneratorExp)
    out, todo = set(), [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        todo += [c for c in ast.iter_child_nodes(node) if not isinstance(c, scoped)]
    return out, False


class _Reads(ast.NodeVisitor):
    """Global names a statement reads, its functions' bodies included (they run later, but
    against the notebook's namespace); names local to a function or comprehension are not."""

    def __init__(self):
        self.reads: set[str] = set()
        self.local: list[set[str]] = []

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and not any(node.id in s for s in self.local):
            self.reads.add(node.id)

    def _scope(self, names: set[str], body) -> None:
        self.local.append(names)
        for node in body:
            self.visit(node)
        self.local.pop()

    def visit_FunctionDef(self, node):
        for d in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if d is not None:
                self.visit(d)
        a = node.args
        params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
        inner = {(al.asname or al.name).split(".")[0] for n in ast.walk(node)
                 if isinstance(n, (ast.Import, ast.ImportFrom)) for al in n.names}
        inner |= {n.name for n in ast.walk(node)
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n is not node}
        self._scope(params | inner | _stored(node.body), node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        a = node.args
        self._scope({x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}, [node.body])

    def _comprehension(self, node):
        self._scope(_stored([g.target for g in node.generators]),
                    [*node.generators, *[getattr(node, f) for f in ("elt", "key", "value")
                                         if hasattr(node, f)]])

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def _read(nodes, bound: set[str]) -> set[str]:
    visitor = _Reads()
    for node in nodes:
        visitor.visit(node)
    return visitor.reads - bound - _BUILTINS


def _block(stmts, bound: set[str], reads: set[str]) -> None:
    """Statements in order: what each reads before the block has bound it (a loop's or a
    `with`'s target is bound before its body reads it)."""
    for stmt in stmts:
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            reads |= _read([stmt.iter], bound)
            bound |= _stored([stmt.target])
            _block(stmt.body + stmt.orelse, bound, reads)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            reads |= _read([w.context_expr for w in stmt.items], bound)
            bound |= _stored([w.optional_vars for w in stmt.items if w.optional_vars])
            _block(stmt.body, bound, reads)
        elif isinstance(stmt, (ast.If, ast.While)):
            reads |= _read([stmt.test], bound)
            _block(stmt.body + stmt.orelse, bound, reads)
        elif isinstance(stmt, ast.Try):
            _block(stmt.body, bound, reads)
            for handler in stmt.handlers:
                reads |= _read([handler.type] if handler.type else [], bound)
                bound |= {handler.name} if handler.name else set()
                _block(handler.body, bound, reads)
            _block(stmt.orelse + stmt.finalbody, bound, reads)
        else:
            reads |= _read([stmt], bound)
            bound |= _binds(stmt)[0]


@dataclass
class CellNames:
    binds: set[str]      # names the cell binds
    imports: set[str]    # of those, bound by an import only
    reads: set[str]      # names it reads that it has not bound itself before
    # each top-level statement: (the names it reads, the names it assigns a value to: not a
    # def, a class or an import)
    steps: list[tuple[set[str], set[str]]]


def names(source: str) -> CellNames:
    tree = ast.parse(python_of(source))
    bound, imported, steps = set(), set(), []
    for stmt in tree.body:
        new, is_import = _binds(stmt)
        bound |= new
        imported = (imported | new) if is_import else (imported - new)
        reads: set[str] = set()
        _block([stmt], set(), reads)
        plain = not is_import and not isinstance(stmt, (ast.FunctionDef, ast.ClassDef))
        steps.append((reads, new if plain else set()))
    reads = set()
    _block(tree.body, set(), reads)
    return CellNames(bound, imported, reads, steps)
