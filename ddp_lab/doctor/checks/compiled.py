"""watch's compile check: torch.compile in the user's own loop, with the script's own settings
(backend, fullgraph, dynamic). Lesson 15.

What each rank records, from outside: every frame dynamo compiles (torch._dynamo.utils.
get_compilation_metrics(), one CompilationMetrics per frame compile: the function, its op count,
`recompile_reason` = the first guard that failed, `fail_type`/`fail_reason`, the stack that
called it; torch/_dynamo/convert_frame.py:1951-1974 and 2180-2250), stamped with the step it
happened in; every graph break as dynamo logs it to its `graph_breaks` artifact logger
(torch/_dynamo/symbolic_convert.py:5026-5136: "Graph break in user code at FILE:LINE", the
reason, the user's traceback), captured by a handler of ours without printing anything.

- `recompiles-every-step` (warning): the same guard fails in two or more steps after the first,
  with a new value each time: state the loop changes between steps is a constant of the graph
  (an int attribute of a module, torch/_dynamo/config.py:402 allow_unspec_int_on_nn_module=False;
  a Python float that cannot become a tensor input). `where` is the user's line that changes
  it (an assignment to that attribute or key outside __init__), or the call passing it in.
- `ranks-compile-differently`: in some step one rank compiled frames the others did not (or
  other ones). DDP's gradient all-reduces stay in DDP's reducer (Note [DDPOptimizer],
  torch/_dynamo/backends/distributed.py:390-420), so the sums stay right; but the rank that
  compiles alone holds every other rank in the next all-reduce for the whole compile (a watchdog
  timeout on a large model), and with compiler or guard collectives it hangs
  (torch.compiler.set_enable_guard_collectives's documentation). An error when the run then
  failed or hung, a warning otherwise, a note when only input shapes differ.
- `graph-break` (info): breaks whose place is the user's code (DDP's own breaks are not); a
  warning only when the same break is traced again in two or more steps after the first.
- `fullgraph-failed` (error): the script raised dynamo's Unsupported (fullgraph=True), with
  PyTorch's reason and the user's line that causes it: for a module backward hook the line that
  registered it (torch/_dynamo/variables/distributed.py:174), for DDP's own break
  (torch/nn/parallel/distributed.py) the line that compiled the DDP model with fullgraph=True.
"""
from __future__ import annotations

import ast
import functools
import logging
import os
import re

from ..report import Finding
from . import Check

LESSON = "15"
GRAPH_BREAKS = "torch._dynamo.symbolic_convert.__graph_breaks"  # symbolic_convert.py:222
DYNAMO_ERRORS = ("Unsupported", "UserError", "UncapturedHigherOrderOpError")  # torch/_dynamo/exc.py
HOOK_CALLS = ("register_full_backward_hook", "register_backward_hook",
              "register_full_backward_pre_hook", "register_module_full_backward_hook")


# --- rank side ---------------------------------------------------------------------------------

class _Breaks(logging.Handler):
    def __init__(self, ctx):
        super().__init__(logging.DEBUG)
        self.ctx = ctx

    def emit(self, record):  # called while dynamo traces: it must never raise
        try:
            self.ctx.add("compile-breaks", _break(self.ctx, record.getMessage()))
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
        where = _describe(at.group(1), int(at.group(2)))
    elif at and _own(at.group(1)):
        # under watch's own TorchFunctionMode (script_mode.FunctionWatch) dynamo breaks inside the
        # mode's __torch_function__, where it calls the user's op: the user's line is the frame
        # right above it (a break deeper in watch's own handlers is watch's, not the user's; DDP's
        # own breaks have torch's frames below the user's call)
        frames = re.findall(r'File "(.+?)", line (\d+)', message.split("User code traceback:")[-1])
        mine = [i for i, (f, _) in enumerate(frames) if ctx.is_user_file(f)]
        if mine and mine[-1] == len(frames) - 2 and _own(frames[-1][0]):
            where = _describe(frames[mine[-1]][0], int(frames[mine[-1]][1]))
    return {"step": ctx.step, "reason": _short(head), "explain": _short(explain)[:300],
            "where": where}


def _short(text: str) -> str:
    """Machine paths out of PyTorch's words: torch's files as torch/..., others by name."""
    def one(m):
        path = m.group(0)
        return path.split("site-packages/", 1)[1] if "site-packages/" in path else os.path.basename(path)
    return re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]+", one, text or "")


def _describe(path: str, line: int) -> str:
    import linecache

    from ..watch.context import describe
    return describe(path, line, linecache.getline(path, line).strip())


def _user_call(ctx, stack) -> str:
    """The innermost user frame of the stack dynamo was called from ("Line: N, Name: f,
    Filename: p" strings, convert_frame.py:309-315), the compiled frame itself left out."""
    for entry in reversed(list(stack or [])[:-1]):
        m = re.match(r"Line: (\d+), Name: .*, Filename: (.+)$", entry)
        if m and ctx.is_user_file(m.group(2)):
            return _describe(m.group(2), int(m.group(1)))
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
    rec = {"step": step, "fn": m.co_name, "file": os.path.basename(m.co_filename or ""),
           "first": m.co_firstlineno, "ops": m.graph_op_count, "user": ctx.is_user_file(
               m.co_filename or ""),
           "call": calls.get(str(m.compile_id)) or _user_call(ctx, m.stack_trace)}
    if m.recompile_reason:
        g = _guard(m.recompile_reason)
        read = g.pop("read")
        g["read"] = _describe(read[0], int(read[1])) if read and ctx.is_user_file(read[0]) else ""
        rec["recompile"] = g
    if m.fail_type:
        at = m.fail_user_frame_filename
        rec["fail"] = {"type": m.fail_type, "reason": _short(m.fail_reason or "").strip()[:600],
                       "at": _describe(at, m.fail_user_frame_lineno)
                       if at and m.fail_user_frame_lineno and ctx.is_user_file(at) else ""}
    return rec


def attach(ctx) -> None:
    """Hooks installed at the script's first torch.compile call (wrapped at its module attribute,
    as nn.Module.compile also calls it): a script that never compiles does not import dynamo."""
    import torch

    state = {"last": None, "calls": {}, "undo": []}
    compile_ = torch.compile

    @functools.wraps(compile_)
    def compile_seen(*args, **kwargs):
        if not state["undo"]:
            ctx.guard(_install)(ctx, state)
        return compile_(*args, **kwargs)

    torch.compile = compile_seen

    def finish(c):
        if torch.compile is compile_seen:
            torch.compile = compile_
        for undo in state["undo"]:
            undo()
        _flush(c, state, c.step)
        if state["undo"]:
            c.emit("compile-sites", _sites(c))

    ctx.on_step_end(lambda c: _flush(c, state, c.step))
    ctx.on_finish(finish)


def _install(ctx, state) -> None:
    import torch._dynamo

    calls = state["calls"]
    # the user's line that called into the frame dynamo compiles: its start callback runs with
    # the caller's Python stack intact (convert_frame.py:1681, callback.py); the stack that
    # CompilationMetrics keeps skips the immediate caller of a compiled function
    started = ctx.guard(lambda args: calls.__setitem__(args.compile_id, ctx.user_line()))
    torch._dynamo.callback_handler.register_start_callback(started)
    logger = logging.getLogger(GRAPH_BREAKS)
    before = (logger.level, logger.propagate)
    handler = _Breaks(ctx)
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
        if m.co_name and m.is_forward is not False and not _own(m.co_filename):
            ctx.add("compiles", _compile(ctx, m, step, state["calls"]))
    if metrics:
        state["last"] = metrics[-1]


def _own(filename) -> bool:
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.abspath(filename or "").startswith(home + os.sep)


def _sites(ctx) -> dict:
    """Lines of the user's files that may set what a guard read or what dynamo refused:
    assignments to the names the failed guards read (outside __init__), calls passing them as
    keywords, and module backward-hook registrations."""
    names = {c["recompile"]["name"] for c in ctx.records.get("compiles", [])
             if c.get("recompile", {}).get("name")}
    files = {ctx.script}
    out = {"assign": {}, "keyword": {}, "hooks": []}
    for path in sorted(files):
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except (OSError, SyntaxError, ValueError):
            continue
        for node, inside_init in _walk(tree):
            for name in _assigned(node):
                if name in names and not inside_init:
                    out["assign"].setdefault(name, []).append(_describe(path, node.lineno))
            if isinstance(node, ast.Call):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else ""
                if fn in HOOK_CALLS:
                    out["hooks"].append(_describe(path, node.lineno))
                for kw in node.keywords:
                    if kw.arg in names:
                        out["keyword"].setdefault(kw.arg, []).append(_describe(path, node.lineno))
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


# --- parent side -------------------------------------------------------------------------------

def judge(ev) -> list[Finding]:
    if not any(r.get("compiles") or r.get("compile-breaks") for r in ev.ranks):
        return []
    return _fullgraph(ev) + _recompiles(ev) + _differ(ev) + _breaks(ev)


def _site(ev, kind: str):
    return next((r["compile-sites"][kind] for r in ev.ranks if r.get("compile-sites")),
                {} if kind != "hooks" else [])


def _failed(ev) -> bool:
    if ev.run is not None and ev.run.status != "ok":
        return True
    return any(r.get("hung") or r.get("error") for r in ev.ranks)


def _fullgraph(ev) -> list[Finding]:
    rank, err = next(((r, x["error"]) for r, x in enumerate(ev.ranks) if x.get("error")
                      and x["error"].get("type") in DYNAMO_ERRORS), (None, None))
    if err is None:
        return []
    message = err.get("message", "")
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    hints = [ln for ln in lines if ln.startswith("Hint:")][:2]
    traced = re.findall(r'File "(.+?)", line (\d+)', message.split("from user code:", 1)[-1])
    where, why = "", ""
    if "backwards hooks" in message:  # torch/_dynamo/variables/distributed.py:174
        where = next(iter(_site(ev, "hooks")), "")
        why = "the module backward hook registered here: dynamo cannot trace it without compiled autograd"
    elif traced and traced[-1][0].replace("\\", "/").endswith("torch/nn/parallel/distributed.py"):
        where = next((s.get("line", "") for r in ev.ranks for s in r.get("compile-settings", [])
                      if s.get("fullgraph") == "True"), "")
        why = ("fullgraph=True on the DDP wrapper: DDP's own forward breaks the graph "
               "(torch/nn/parallel/distributed.py), and DDPOptimizer splits it at every bucket")
    if not where:
        where = next((c["fail"]["at"] for c in ev.ranks[rank].get("compiles", [])
                      if c.get("fail", {}).get("at")), "") or err.get("line", "")
    ev_lines = [f"rank {rank}: PyTorch ({err['type']}): {_short(lines[0]) if lines else ''}"]
    if "DDP" not in why:  # for DDP's own break PyTorch's hints speak of code that is not the user's
        ev_lines += [_short(f"PyTorch's {h[0].lower()}{h[1:]}") for h in hints]
    if why:
        ev_lines.append(f"the cause: {why}")
    return [Finding(
        "error", "fullgraph-failed", LESSON,
        "torch.compile(fullgraph=True) cannot capture the model in one graph: the script fails",
        ev_lines, _fullgraph_fix(message, why), where=where)]


def _fullgraph_fix(message: str, why: str) -> str:
    if "backwards hooks" in message:
        return ("hook the module's parameters instead (p.register_hook or "
                "register_post_accumulate_grad_hook, registered before compiling: they run "
                "outside the graph; corpus 53's fixed script), enable compiled autograd as "
                "PyTorch's hint says, or drop fullgraph=True")
    if "DDP" in why:
        return ("compile the module, then wrap it: DDP(torch.compile(model, fullgraph=True)); or "
                "keep fullgraph=False on the DDP model (its breaks are DDP's own)")
    return ("make that line traceable (no data-dependent Python branch, .item(), print or "
            "untraceable call in the compiled code), or drop fullgraph=True")


def _recompiles(ev) -> list[Finding]:
    groups: dict = {}
    for rank, r in enumerate(ev.ranks):
        for c in r.get("compiles", []):
            g = c.get("recompile")
            if g and c["step"] >= 1:
                e = groups.setdefault((c["fn"], g["group"]), {"ranks": {}, "values": set(), "c": c})
                e["ranks"].setdefault(rank, set()).add(c["step"])
                e["values"].add(g["value"])
    found = []
    for (fn, group), e in groups.items():
        if max(len(s) for s in e["ranks"].values()) < 2 or len(e["values"]) < 2:
            continue
        g, c = e["c"]["recompile"], e["c"]
        where = _changed_at(ev, g, c)
        ev_lines = [f"rank {r}: {fn} recompiled in steps {', '.join(map(str, sorted(s)))}"
                    for r, s in sorted(e["ranks"].items())]
        ev_lines.append(f"PyTorch's guard that failed: {g['guard']}"
                        + (f" (read at {g['read']})" if g["read"] else ""))
        if g["hint"]:
            ev_lines.append(f"PyTorch's hint: {g['hint']}")
        ev_lines.append("past torch._dynamo.config.recompile_limit (8, torch/_dynamo/config.py:121) "
                        "dynamo stops compiling the function and runs it eagerly")
        what = ("an input's size changes between steps and each size is compiled anew"
                if g["shape"] else f"{g['name'] or 'a value'} changes between steps and is a "
                "constant of the compiled graph")
        fix = ("keep the size fixed (pad to it), or mark that dimension dynamic before the call "
               "(torch._dynamo.mark_dynamic(x, dim))" if g["shape"] else
               "keep what changes every step in a tensor (a buffer updated in place with .fill_(), "
               "or a tensor argument, e.g. lr=torch.tensor(0.01)), not in a Python int or float")
        found.append(Finding("warning", "recompiles-every-step", LESSON,
                             f"torch.compile recompiles {fn} every step: {what}", ev_lines, fix,
                             where=where))
    return found


def _changed_at(ev, g: dict, c: dict) -> str:
    """The user's line that changes what the guard reads: an assignment to that attribute or key,
    a keyword that sets it (an optimizer's lr=), else the call that passes it in."""
    name = g["name"]
    local = re.match(rf"^{re.escape(name)}\s*==", g["guard"]) if name else None
    if name and not local:
        sites = _site(ev, "assign").get(name) or _site(ev, "keyword").get(name)
        if sites:
            return sites[0]
    return c.get("call") or g.get("read", "")


def _signature(c: dict) -> tuple:
    g = c.get("recompile") or {}
    return (c["fn"], c["file"], c["first"], c["ops"], g.get("group", ""))


def _differ(ev) -> list[Finding]:
    from collections import Counter

    per = [{} for _ in ev.ranks]
    for rank, r in enumerate(ev.ranks):
        for c in r.get("compiles", []):
            per[rank].setdefault(c["step"], []).append(c)
    ended = min((len([s for s in ev.steps(r) if s.get("end")]) for r in range(len(ev.ranks))),
                default=0)
    failed = _failed(ev)
    for step in range(ended + (1 if failed else 0)):
        counts = [Counter(map(_signature, p.get(step, []))) for p in per]
        if all(c == counts[0] for c in counts[1:]):
            continue
        union = sum(counts, Counter())
        extra = [(r, c) for r, p in enumerate(per) for c in p.get(step, [])
                 if counts[r][_signature(c)] * len(counts) > union[_signature(c)]]
        if not extra:
            continue
        shape = all(c.get("recompile", {}).get("shape") for _, c in extra)
        level = "error" if failed and step >= ended else "info" if shape else "warning"
        return [_differ_finding(ev, per, step, extra, level)]
    return []


def _differ_finding(ev, per, step, extra, level) -> Finding:
    ev_lines = []
    for rank in range(len(ev.ranks)):
        mine = sorted(per[rank].get(step, []), key=lambda c: not c.get("user"))
        ev_lines.append(f"rank {rank}, step {step}: compiled " + (", ".join(
            f"{c['fn']} ({c['file']}:{c['first']}, {c['ops']} ops"
            + (f", guard failed: {c['recompile']['guard']}" if c.get("recompile") else "") + ")"
            for c in mine[:4]) or "nothing"))
    rank, first = extra[0]
    ev_lines.append("DDP's all-reduces stay in its reducer, so the sums stay right; but the rank "
                    "that compiles alone holds every other rank in the next all-reduce for the "
                    "whole compile (a collective timeout on a large model), and with compiler or "
                    "guard collectives the ranks hang")
    if level == "error":
        ev_lines.append("the run then failed or hung in that step")
    return Finding(
        level, "ranks-compile-differently", LESSON,
        f"the ranks compile differently in step {step}: rank {rank} compiles what the others do not",
        ev_lines,
        "run the compiled model the same way on every rank (evaluate on all ranks and log on "
        "rank 0, or evaluate with the uncompiled module); compile every mode before the loop on "
        "every rank (a warm-up step)", where=first.get("call", ""))


def _breaks(ev) -> list[Finding]:
    seen: dict = {}
    for rank, r in enumerate(ev.ranks):
        for b in r.get("compile-breaks", []):
            if b.get("where"):
                e = seen.setdefault((b["where"], b["reason"]), {"ranks": set(), "steps": {}, "b": b})
                e["ranks"].add(rank)
                e["steps"].setdefault(rank, set()).add(b["step"])
    if not seen:
        return []
    again = [k for k, e in seen.items() if any(len({s for s in st if s >= 1}) >= 2
                                               for st in e["steps"].values())]
    ev_lines = [f"{where}: {reason}" + (f" ({e['b']['explain']})" if e["b"].get("explain") else "")
                + f" (rank{'s' if len(e['ranks']) > 1 else ''} {', '.join(map(str, sorted(e['ranks'])))})"
                for (where, reason), e in seen.items()]
    ev_lines.append("each break ends a graph: the code around it runs eagerly" + (
        ", and DDPOptimizer cuts the graphs on each side at DDP's buckets again" if _ddp_compiled(ev)
        else ""))
    if again:
        ev_lines.append("traced again in several steps: the break is recompiled, not only run")
    first = again[0] if again else next(iter(seen))
    return [Finding(
        "warning" if again else "info", "graph-break", LESSON,
        f"torch.compile breaks the graph in the script's code ({len(seen)} place"
        f"{'' if len(seen) == 1 else 's'})", ev_lines,
        "make that line traceable (no print, .item(), data-dependent Python branch or "
        "untraceable call inside the compiled code), or move it out", where=first[0])]


def _ddp_compiled(ev) -> bool:
    """A DDP model under torch.compile (compiled around DDP, or DDP around a compiled module)."""
    return any((m["kind"] == "compiled" and m["type"] == "DistributedDataParallel")
               or (m["kind"] == "ddp" and m["type"] == "OptimizedModule")
               for r in ev.ranks for m in r.get("models", []))


CHECK = Check(
    name="compiled",
    mechanism="torch.compile in the script's own loop: recompiles per step, ranks compiling "
              "differently, graph breaks, fullgraph=True failures",
    lesson=LESSON,
    codes={"recompiles-every-step": "warning", "ranks-compile-differently": "error",
           "graph-break": "warning", "fullgraph-failed": "error"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_compiled.py",
    notes=("compiles are read from torch._dynamo.utils.get_compilation_metrics(), which keeps "
           "the last 64: a step that compiles more loses the oldest",
           "graph breaks outside the script's files (DDP's own, a library's) are not reported"))
