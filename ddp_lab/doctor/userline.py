"""The user's line, written one way for every tool of the wing: `train.py:42: loss.backward()`
(a file name that does not vary between machines, the line number, the line's text).

Code that travels to the ranks by value (cloudpickle: a notebook's cells, a file the CLI loaded)
has no file there: a rank names it `<dynamic-code...>`, and the parent, which still has the
functions, names it again from a code map ({function name: (file, first line, last line)}).
Which frame is the user's is decided in frames.py; this module only writes lines, and finds
them in the user's files by what they store (`stores`: a write no hook can see).
"""
from __future__ import annotations

import ast
import inspect
import linecache
import os
import re
import sys
from functools import lru_cache

_CELL = re.compile(r".*/ipykernel_\d+/\d+\.py$|<ipython-input-[^>]*>")
_DYNAMIC = re.compile(r"<dynamic-code:([^>]+)>:(\d+): ?")
_AT = re.compile(r"(.+):(\d+) in (\S+)$")  # "path:line in function" (compilewatch's places)
DYNAMIC = "<dynamic-code"  # how a rank names code shipped by value


def short_file(path: str) -> str:
    """A file name that does not vary between machines or runs."""
    path = path.replace("\\", "/")
    return "<notebook cell>" if _CELL.match(path) else os.path.basename(path)


def short_paths(text: str) -> str:
    """Machine paths out of PyTorch's words: torch's files as torch/..., others by name."""
    def one(m):
        path = m.group(0)
        return path.split("site-packages/", 1)[1] if "site-packages/" in path else os.path.basename(path)
    return re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]+", one, text or "")


def text_of(path: str, lineno: int) -> str:
    return linecache.getline(path, lineno).strip()


def line(path: str, lineno: int, text: str) -> str:
    """The one shape: `file.py:12: text`."""
    return f"{short_file(path)}:{lineno}: {text}"


def describe(filename: str, lineno: int, text: str | None = None) -> str:
    """"train.py:42: loss.backward()" (the line's text read from the file unless given); code
    shipped by value keeps its rank-side name, for `restore_where` to name in the parent."""
    if filename.startswith(DYNAMIC):
        return f"{filename}:{lineno}: {text or ''}"
    return line(filename, lineno, text_of(filename, lineno) if text is None else text)


def site_line(filename: str, lineno: int, func: str, where: dict | None = None) -> str:
    """`file.py:12: text` of a (file, line, function) site a rank recorded, code shipped by
    value named through `where` ({function name: (file, first, last)}); "" without a text."""
    if filename.startswith(DYNAMIC) and func in (where or {}):
        real, first, last = where[func]
        filename = real if first <= lineno <= last else filename
    text = text_of(filename, lineno)
    return line(filename, lineno, text) if text else ""


def describe_frame(filename: str, lineno: int, qualname: str) -> str:
    """`Net.forward (net.py:12): code`; code shipped by value has no file name on the rank:
    `Net.forward, line 12`."""
    filename = filename.replace("\\", "/")
    if filename.startswith(DYNAMIC):
        return f"{qualname}, line {lineno}"
    code = text_of(filename, lineno)
    return f"{qualname} ({short_file(filename)}:{lineno}){': ' + code if code else ''}"


# --- code maps: which file a function shipped by value comes from ------------------------------

def _span(code) -> tuple[str, int, int] | None:
    try:
        lines, first = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return None
    return code.co_filename, first, first + len(lines) - 1


def code_map(model) -> dict[str, tuple[str, int, int]]:
    """{function name: (file, first line, last line)} of the user's own module classes."""
    out: dict[str, tuple[str, int, int]] = {}
    for m in model.modules():
        for cls in type(m).__mro__:
            if cls.__module__.split(".")[0] in ("torch", "builtins"):
                continue
            for fn in vars(cls).values():
                code = getattr(getattr(fn, "__func__", fn), "__code__", None)
                span = _span(code) if code is not None else None
                if span is not None:
                    out.setdefault(code.co_name, span)
    return out


def code_of(fn) -> dict:
    """{function name: (file, first line, last line)} of `fn` (the user's parallelize), as
    code_map gives for the module's methods."""
    code = getattr(fn, "__code__", None)
    span = _span(code)
    return {code.co_name: span} if span else {}


def code_ranges(model, where: dict | None) -> dict[str, list[tuple[str, int, int]]]:
    """{function name: [(file, first line, last line), ...]}: `where` (code_map, one per name)
    and every function and method of the Python modules that define the classes of `model` (an
    instance; None: `where` alone), so that code shipped by value (`<dynamic-code>`, which keeps its line numbers) is
    named even when two classes both have an `__init__`, or a helper function registers a hook."""
    out: dict[str, list] = {}
    for name, span in (where or {}).items():
        out.setdefault(name, []).append(span)
    names = {type(m).__module__ for m in model.modules()} if model is not None else set()
    for modname in sorted(n for n in names if n.split(".")[0] not in ("torch", "builtins")):
        for obj in list(vars(sys.modules.get(modname) or object).values()):
            if inspect.isclass(obj) and obj.__module__ == modname:
                functions = list(vars(obj).values())
            else:
                functions = [obj] if inspect.isfunction(obj) else []
            for fn in functions:
                code = getattr(getattr(fn, "__func__", fn), "__code__", None)
                span = _span(code)
                if span is not None and span not in out.setdefault(code.co_name, []):
                    out[code.co_name].append(span)
    return out


def code_files(*objects) -> dict[str, str]:
    """{qualified name: file} of the user's functions and classes' methods: `objects` and every
    function or class in their modules' globals (a notebook's cells, a loaded file)."""
    out: dict[str, str] = {}
    seen = set()

    def add(obj):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        code = getattr(obj, "__code__", None)
        if code is not None and not code.co_filename.startswith("<"):
            out.setdefault(getattr(code, "co_qualname", code.co_name), code.co_filename)
        if inspect.isclass(obj):
            for value in vars(obj).values():
                add(getattr(value, "__func__", value))
    for obj in objects:
        if obj is None:
            continue
        add(obj)
        for value in list(getattr(obj, "__globals__", {}).values()):
            if inspect.isfunction(value) or inspect.isclass(value):
                add(value)
    return out


def restore_where(text: str, files: dict[str, str]) -> str:
    """"<dynamic-code:train_step>:75: " -> "cell.py:75: loss = ..." where `files` knows it."""
    def named(m):
        path = files.get(m.group(1))
        if path is None:
            return f"{m.group(1)}, line {m.group(2)}: "
        return describe(path, int(m.group(2)))
    return _DYNAMIC.sub(named, text)


# --- compilewatch's places: "path:line in function" ---------------------------------------------

def _located(at: str, where: dict | None):
    m = _AT.match(at or "")
    if not m:
        return None
    path, n, fn = m.group(1), int(m.group(2)), m.group(3)
    if path.startswith(DYNAMIC) and fn in (where or {}):
        spans = where[fn] if isinstance(where[fn], list) else [where[fn]]
        path = next((real for real, first, last in spans if first <= n <= last), path)
    return short_file(path), n, fn, text_of(path, n)


def place(at: str, where: dict | None) -> str:
    """`file:line in fn: code` for a CompileWatch location, the file named even for code shipped
    by value (`<dynamic-code...>`), the path shortened so the report does not vary by machine."""
    found = _located(at, where)
    if not found:
        return at
    path, n, fn, code = found
    return f"{path}:{n} in {fn}" + (f": {code}" if code else "")


def at_line(at: str, where: dict | None) -> str:
    """A CompileWatch location as Finding.where gives it: `file:line: code`."""
    found = _located(at, where)
    if not found:
        return ""
    path, n, _, code = found
    return f"{path}:{n}" + (f": {code}" if code else "")


# --- lines found in the user's classes' source --------------------------------------------------

def _class_lines(module):
    """(file, first line, lines) of the user's classes in `module`'s MRO (not torch's)."""
    for cls in type(module).__mro__:
        if cls.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        try:
            lines, first = inspect.getsourcelines(cls)
            yield inspect.getsourcefile(cls), first, lines
        except (OSError, TypeError):
            continue


def line_in_class(module, pattern: re.Pattern) -> str:
    """The first line of `module`'s own classes that `pattern` finds, or ""."""
    for path, first, lines in _class_lines(module):
        for i, text in enumerate(lines):
            if pattern.search(text):
                return line(path, first + i, text.strip())
    return ""


def line_in_function(fn, pattern: re.Pattern) -> str | None:
    """The first line of function `fn` that `pattern` finds; "" when none does, None when its
    source cannot be read."""
    try:
        lines, first = inspect.getsourcelines(fn)
        path = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    for i, text in enumerate(lines):
        if pattern.search(text):
            return line(path, first + i, text.strip())
    return ""


@lru_cache(maxsize=64)
def source_tree(path: str):
    """The user's file at `path` parsed (None when it cannot be read or parsed), once."""
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


# --- statements found by what they store: where a run shows THAT a value changed but no hook sees
# the write (a plain dict's item, a module's attribute).

def _assigned(node) -> list:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AugAssign, ast.AnnAssign)) else []
    return [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]


def _stored_key(target) -> str | None:
    key = target.slice if isinstance(target, ast.Subscript) else None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


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
        tree = source_tree(path)
        if tree is None:
            continue
        for node in ast.walk(tree):
            hit = any((_stored_key(t) in keys) if keys else False for t in _assigned(node))
            hit = hit or bool(keys & _updated_keys(node))
            if attr:
                hit = hit or any(isinstance(t, ast.Attribute) and t.attr == attr for t in _assigned(node))
            if hit:
                out.append((path, node.lineno))
    return [describe(p, n) for p, n in sorted(set(out))]


def user_files(script: str, holds) -> list[str]:
    """The script and every module the run imported that `holds(path)` says is the user's."""
    found = [script]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and holds(path):
            found.append(path)
    return list(dict.fromkeys(found))
