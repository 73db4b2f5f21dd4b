"""The logged check's reader of the user's logging lines (logged.py): whether a number a tensor
conversion produced (item, float, tolist, a format) is what a logging call on that line shows,
and by which factor (`loss.item() / world_size` logs item / world_size)."""
from __future__ import annotations

import ast
import builtins
import linecache

LOGGERS = {"print", "info", "debug", "warning", "log", "add_scalar", "add_scalars", "write",
           "set_postfix", "set_description", "log_metrics", "log_dict", "pprint"}
FORMATTERS = {"str", "float", "round", "format", "dict", "list", "tuple", "repr"}


_TREES: dict = {}  # file -> its logging calls' nodes and their parents


_POSITIONS: dict = {}  # code -> (line, end line, column, end column) of each instruction


CALLED_AS = {"item": ("item",), "__float__": ("float",), "tolist": ("tolist",),
             "__format__": ("format", "")}  # the user's expression that ran the conversion


def logged_how(frame, conversion):
    """("value", scale) when the conversion running in `frame` is shown by a logging call on its
    line (the number times `scale`: `loss.item() / world_size` logs item/world_size), ("format",
    1) for a tensor formatted in a logging call; None when the number goes elsewhere, or when
    the user's expression is not the conversion itself (an item() inside a library function
    called on a logging line is not what the line shows)."""
    code = frame.f_code
    if code not in _POSITIONS:
        _POSITIONS[code] = list(code.co_positions())
    pos = _POSITIONS[code][frame.f_lasti // 2]
    nodes, parents = _tree(frame.f_code.co_filename)
    node = nodes.get(pos)
    if node is None or (_name(node) if isinstance(node, ast.Call) else "") not in CALLED_AS.get(
            conversion, ()):
        return None
    kind = "format" if isinstance(node, ast.JoinedStr) or _name(node) == "format" else "value"
    scale = 1.0
    while node in parents:
        up = parents[node]
        if isinstance(up, ast.Call) and _name(up) in LOGGERS and not _maths(up):
            return kind, scale
        if isinstance(up, ast.BinOp) and kind == "value":
            if isinstance(up.op, ast.Mod) and isinstance(up.left, ast.Constant):
                pass  # "loss %.4f" % value
            elif isinstance(up.op, (ast.Mult, ast.Div)):
                other = up.right if up.left is node else up.left
                k = _evaluate(other, frame)
                if k is None or k == 0 or (isinstance(up.op, ast.Div) and up.left is not node):
                    return None
                scale = scale * k if isinstance(up.op, ast.Mult) else scale / k
            else:
                return None
        elif isinstance(up, ast.Call) and _name(up) not in FORMATTERS:
            return None
        elif not isinstance(up, (ast.Call, ast.FormattedValue, ast.JoinedStr, ast.Dict,
                                 ast.List, ast.Tuple, ast.keyword, ast.BinOp)):
            return None
        node = up
    return None


def _tree(filename):
    if filename not in _TREES:
        nodes, parents = {}, {}
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except SyntaxError:
            tree = ast.Module(body=[], type_ignores=[])
        for up in ast.walk(tree):
            for child in ast.iter_child_nodes(up):
                parents[child] = up
            if isinstance(up, (ast.Call, ast.JoinedStr)):
                nodes[(up.lineno, up.end_lineno, up.col_offset, up.end_col_offset)] = up
        _TREES[filename] = (nodes, parents)
    return _TREES[filename]


def _maths(call):
    """math.log(x.item()) and its kin: a function named like a logger that is not one."""
    f = call.func
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in (
        "math", "cmath", "np", "numpy", "torch", "scipy")


def _name(call):
    f = call.func if isinstance(call, ast.Call) else None
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _evaluate(node, frame):
    """A constant, a name or an attribute chain's number in the user's frame (nothing called)."""
    if isinstance(node, ast.Constant):
        value = node.value
    elif isinstance(node, ast.Name):
        value = frame.f_locals.get(node.id, frame.f_globals.get(node.id, getattr(
            builtins, node.id, None)))
    elif isinstance(node, ast.Attribute):
        owner = _evaluate_object(node.value, frame)
        value = getattr(owner, node.attr, None)
    else:
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _evaluate_object(node, frame):
    if isinstance(node, ast.Name):
        return frame.f_locals.get(node.id, frame.f_globals.get(node.id))
    if isinstance(node, ast.Attribute):
        return getattr(_evaluate_object(node.value, frame), node.attr, None)
    return None


# --- the expression running in a user's frame (the scaling of a loss: _logged_scale.py) -------
_EXPRESSIONS: dict = {}  # file -> {position: BinOp, AugAssign or Call node}


def expression_at(frame):
    """The BinOp, AugAssign or Call node whose source span is the instruction running in
    `frame` (Python 3.11's co_positions), or None."""
    code = frame.f_code
    if code not in _POSITIONS:
        _POSITIONS[code] = list(code.co_positions())
    pos = _POSITIONS[code][frame.f_lasti // 2]
    filename = code.co_filename
    if filename not in _EXPRESSIONS:
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except SyntaxError:
            tree = ast.Module(body=[], type_ignores=[])
        _EXPRESSIONS[filename] = {
            (n.lineno, n.end_lineno, n.col_offset, n.end_col_offset): n for n in ast.walk(tree)
            if isinstance(n, (ast.BinOp, ast.AugAssign, ast.Call))}
    return _EXPRESSIONS[filename].get(pos)


def name_of(call) -> str:
    return _name(call)


def value_of(node, frame):
    """A constant's, a name's, an attribute chain's or a constant subscript's value in the
    user's frame (os.environ["WORLD_SIZE"]); nothing is called. None when unknown."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        owner = _evaluate_object(node.value, frame)
        try:
            return owner[node.slice.value] if isinstance(owner, (dict, list, tuple)) or (
                type(owner).__name__ == "_Environ") else None
        except (KeyError, IndexError, TypeError):
            return None
    return _evaluate_object(node, frame) if isinstance(node, (ast.Name, ast.Attribute)) else None
