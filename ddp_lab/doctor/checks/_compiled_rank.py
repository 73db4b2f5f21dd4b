"""The compiled check's rank side in a watched run (compiled.py): every frame dynamo compiles
(with the grad mode it was compiled under and the compiled callable whose call compiled it),
every graph break (and whether it lies on the path of every call of a compiled module's
forward: _compiled_paths.py), the steps in which each compiled callable ran, and the script's
lines that may set what a guard read. Nothing printed, nothing raised into the user's loop."""
from __future__ import annotations

import ast
import functools
import logging
import os
import re

from ..frames import in_package
from ..userline import describe, short_paths
from ._compiled_paths import on_every_call, reads_of

GRAPH_BREAKS = "torch._dynamo.symbolic_convert.__graph_breaks"  # symbolic_convert.py:222
HOOK_CALLS = ("register_full_backward_hook", "register_backward_hook",
              "register_full_backward_pre_hook", "register_module_full_backward_hook")


class _Breaks(logging.Handler):
    def __init__(self, ctx, state):
        super().__init__(logging.DEBUG)
        self.ctx, self.state = ctx, state

    def emit(self, record):  # called while dynamo traces: it must never raise
        try:
            message = record.getMessage()
            b = _break(self.ctx, message)
            b["callable"] = self.state["active"]
            b.update(on_every_call(self.ctx, message))
            self.ctx.add("compile-breaks", b)
        except Exception as exc:  # noqa: BLE001
            self.ctx.add("check-errors", f"compiled break handler: {type(exc).__name__}: {exc}")


def _break(ctx, message: str) -> dict:
    at = re.search(r"in user code at (.+?):(\d+)", message)
    reason = message.split("Graph Break Reason:", 1)[-1].strip().splitlines()
    lines = [ln.strip() for ln in reason if ln.strip()]
    # "Encountered graph break when ...:" / "Failed to handle ...:": the reason proper follows
    head = lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0] if lines else ""
    explain = next((ln[len("Explanation:"):].strip() for ln in lines
                    if ln.startswith("Explanation:")), "")
    where = ""
    if at and ctx.is_user_file(at.group(1)):
        where = describe(at.group(1), int(at.group(2)))
    elif at and in_package(at.group(1)):
        # under watch's own TorchFunctionMode (core.FunctionWatch) dynamo breaks inside the
        # mode's __torch_function__, where it calls the user's op: the user's line is the frame
        # right above it (a break deeper in watch's own handlers is watch's, not the user's; DDP's
        # own breaks have torch's frames below the user's call)
        frames = re.findall(r'File "(.+?)", line (\d+)', message.split("User code traceback:")[-1])
        mine = [i for i, (f, _) in enumerate(frames) if ctx.is_user_file(f)]
        if mine and mine[-1] == len(frames) - 2 and in_package(frames[-1][0]):
            where = describe(frames[mine[-1]][0], int(frames[mine[-1]][1]))
    return {"step": ctx.step, "reason": short_paths(head), "explain": short_paths(explain)[:300],
            "where": where}


def _user_call(ctx, stack) -> str:
    """The innermost user frame of the stack dynamo was called from ("Line: N, Name: f,
    Filename: p" strings, convert_frame.py:309-315), the compiled frame itself left out."""
    for entry in reversed(list(stack or [])[:-1]):
        m = re.match(r"Line: (\d+), Name: .*, Filename: (.+)$", entry)
        if m and ctx.is_user_file(m.group(2)):
            return describe(m.group(2), int(m.group(1)))
    return ""


def _guard(text: str) -> dict:
    """PyTorch's recompile reason: the guard (its value left out for grouping), the name it
    reads, where the compiled code reads it, and PyTorch's hint."""
    first = text.splitlines()[0] if text else ""
    raw = re.sub(r"^\d+/\d+:\s*", "", first.split("  #")[0]).strip()
    expr = re.sub(r"\b\d{9,}\b", "<id>", raw)  # ___check_obj_id / type ids: addresses
    name = re.findall(r"(?:\.(\w+)|\[['\"](\w+)['\"]\]|^(\w+))\s*==", expr)
    read = re.findall(r'File "(.+?)", line (\d+)', text)
    hint = re.search(r"\(HINT: (.+?)\)\s*$", first)
    group = re.sub(r"expected \d+, actual \d+", "expected N, actual N", expr)  # a shape guard
    group = re.sub(r"==\s*.+$", "== ...", group)
    return {"guard": expr[:300], "group": group[:300],
            "name": next((a or b or c for a, b, c in name[-1:]), ""),
            "value": raw.split("==", 1)[1].strip()[:80] if "==" in raw else raw[:80],
            "shape": "size mismatch" in expr or "stride mismatch" in expr,
            "read": read[-1] if read else None, "hint": hint.group(1) if hint else ""}


def _compile(ctx, m, step: int, calls: dict) -> dict:
    started = calls.get(str(m.compile_id)) or {}
    rec = {"step": step, "fn": m.co_name, "file": os.path.basename(m.co_filename or ""),
           "first": m.co_firstlineno, "ops": m.graph_op_count, "user": ctx.is_user_file(
               m.co_filename or ""),
           "call": started.get("line") or _user_call(ctx, m.stack_trace),
           "grad": started.get("grad"), "callable": started.get("callable")}
    if m.recompile_reason:
        g = _guard(m.recompile_reason)
        read = g.pop("read")
        mine = bool(read) and ctx.is_user_file(read[0])
        g["read"] = describe(read[0], int(read[1])) if mine else ""
        g["read_at"] = [read[0], int(read[1])] if mine else None
        rec["recompile"] = g
    if m.fail_type:
        at = m.fail_user_frame_filename
        rec["fail"] = {"type": m.fail_type, "reason": short_paths(m.fail_reason or "").strip()[:600],
                       "at": describe(at, m.fail_user_frame_lineno)
                       if at and m.fail_user_frame_lineno and ctx.is_user_file(at) else ""}
    return rec


def attach(ctx) -> None:
    """Hooks installed at the script's first torch.compile call (wrapped at its module attribute,
    as nn.Module.compile also calls it): a script that never compiles does not import dynamo."""
    import torch

    state = {"last": None, "calls": {}, "undo": [], "active": None, "ran": []}
    compile_ = torch.compile

    @functools.wraps(compile_)
    def compile_seen(*args, **kwargs):
        if not state["undo"]:
            ctx.guard(_install)(ctx, state)
        if (args[0] if args else kwargs.get("model")) is None:  # @torch.compile(...): a factory
            kwargs.pop("model", None)
            return lambda fn: compile_seen(fn, **kwargs)
        out = compile_(*args, **kwargs)
        counted = ctx.guard(_counted)(ctx, state, out)
        return out if counted is None else counted  # (a module's truth is its len())

    torch.compile = compile_seen

    def finish(c):
        if torch.compile is compile_seen:
            torch.compile = compile_
        for undo in state["undo"]:
            undo()
        _flush(c, state, c.step)
        if state["undo"]:
            c.emit("compile-sites", _sites(c))
            c.emit("compile-ran", [_ranges(steps) for steps in state["ran"]])

    ctx.on_step_end(lambda c: _flush(c, state, c.step))
    ctx.on_finish(finish)


def _install(ctx, state) -> None:
    import torch._dynamo

    calls = state["calls"]
    # the user's line that called into the frame dynamo compiles: its start callback runs with
    # the caller's Python stack intact (convert_frame.py:1681, callback.py); the stack that
    # CompilationMetrics keeps skips the immediate caller of a compiled function. Only dynamo's
    # own trigger: a backward that AOT compiles lazily calls back with the same compile id from
    # loss.backward() (callback.py CallbackTrigger.LAZY_BACKWARD). The grad mode is the one the
    # frame is traced under (a graph compiled under no_grad is an inference graph).
    def start(args):
        if getattr(args.callback_trigger, "name", "DYNAMO") == "DYNAMO":
            calls.setdefault(args.compile_id, {"line": ctx.user_line(), "callable": state["active"],
                                               "grad": torch.is_grad_enabled()})

    started = ctx.guard(start)
    torch._dynamo.callback_handler.register_start_callback(started)
    logger = logging.getLogger(GRAPH_BREAKS)
    before = (logger.level, logger.propagate)
    handler = _Breaks(ctx, state)
    if not logger.isEnabledFor(logging.DEBUG):  # not asked for by TORCH_LOGS: print nothing
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    logger.addHandler(handler)

    def undo():
        torch._dynamo.callback_handler.remove_start_callback(started)
        logger.removeHandler(handler)
        logger.setLevel(before[0])
        logger.propagate = before[1]

    state["undo"].append(undo)


def _flush(ctx, state, step: int) -> None:
    """The frames dynamo compiled since the last call (CompilationMetrics, newest last)."""
    if not state["undo"]:
        return  # torch.compile never called: nothing compiled
    from torch._dynamo import utils

    metrics = utils.get_compilation_metrics()
    last = state["last"]
    start = next((i + 1 for i in range(len(metrics) - 1, -1, -1) if metrics[i] is last), 0)
    for m in metrics[start:]:
        # AOT's own records carry no frame; the checks' own hooks are not the script's
        if m.co_name and m.is_forward is not False and not in_package(m.co_filename):
            ctx.add("compiles", _compile(ctx, m, step, state["calls"]))
    if metrics:
        state["last"] = metrics[-1]


def _counted(ctx, state, out):
    """What torch.compile returned, its calls counted per step (`compile-ran`): a module's
    forward, or the compiled function. While it runs, `state["active"]` is its index, which the
    frames it compiles and the breaks they trace carry."""
    import torch

    index = len(state["ran"])
    steps: list[int] = []
    state["ran"].append(steps)

    def counting(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not steps or steps[-1] != ctx.step:
                steps.append(ctx.step)
            outer, state["active"] = state["active"], index
            try:
                return fn(*args, **kwargs)
            finally:
                state["active"] = outer
        return call

    if isinstance(out, torch.nn.Module):
        out.forward = counting(out.forward)
        return out
    return counting(out) if callable(out) else out


def _ranges(steps: list[int]) -> list[list[int]]:
    """[3, 4, 5, 9] -> [[3, 5], [9, 9]]."""
    out: list[list[int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        elif not out or s > out[-1][1]:
            out.append([s, s])
    return out


def _sites(ctx) -> dict:
    """Lines of the user's files that may set what a guard read or what dynamo refused:
    assignments to the names the failed guards read (outside __init__), calls passing them as
    keywords, module backward-hook registrations, and for each guarded name the function that
    read it (`reads`: its own writes of the name and the lines that load it)."""
    guards = [c["recompile"] for c in ctx.records.get("compiles", [])
              if c.get("recompile", {}).get("name")]
    names = {g["name"] for g in guards}
    files = {ctx.script}
    out = {"assign": {}, "keyword": {}, "hooks": [], "reads": {}}
    for g in guards:
        if g.get("read_at") and g["name"] not in out["reads"]:
            found = reads_of(*g["read_at"], g["name"])
            if found:
                out["reads"][g["name"]] = found
    for path in sorted(files):
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except (OSError, SyntaxError, ValueError):
            continue
        for node, inside_init in _walk(tree):
            for name in _assigned(node):
                if name in names and not inside_init:
                    out["assign"].setdefault(name, []).append(describe(path, node.lineno))
            if isinstance(node, ast.Call):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else ""
                if fn in HOOK_CALLS:
                    out["hooks"].append(describe(path, node.lineno))
                for kw in node.keywords:
                    if kw.arg in names:
                        out["keyword"].setdefault(kw.arg, []).append(describe(path, node.lineno))
    return out


def _walk(tree):
    stack = [(tree, False)]
    while stack:
        node, inside = stack.pop()
        yield node, inside
        init = isinstance(node, ast.FunctionDef) and node.name == "__init__"
        stack.extend((child, inside or init) for child in reversed(list(ast.iter_child_nodes(node))))


def _assigned(node) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AugAssign, ast.AnnAssign)) else []
    names = []
    for t in targets:
        if isinstance(t, ast.Attribute):
            names.append(t.attr)
        elif isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant):
            names.append(str(t.slice.value))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
            and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
        names.append(str(node.args[1].value))
    return names
